//! Hand-written SQL that PostgreSQL plans once per connection.
//!
//! diesel's `sql_query` never uses the prepared-statement cache (its text could be built at run
//! time), so every execution is parsed and planned again: for the hot statements of this
//! project that doubles their cost on the server. [`CachedSql`] carries fixed SQL text and its
//! binds, and lets diesel cache the prepared statement by that text.
//!
//! Not for a statement whose good plan depends on its values: after five executions
//! PostgreSQL may settle on a generic plan, blind to them. A statement over arrays of any
//! size needs one plan good for every size (the ingest insert: a function scan feeding the
//! insert, nothing joined).
//!
//! Row states are therefore not binds: a generic plan cannot prove that `status = $1` matches
//! a partial index's `WHERE status = 0`. [`statuses_sql!`] writes them into the text instead,
//! from [`InboxStatus`], once per process.

use std::marker::PhantomData;

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};
use diesel::QueryResult;

use crate::InboxStatus;

/// `sql` with every `{ready}`, `{processing}`, `{done}` and `{dead}` replaced by that
/// [`InboxStatus`]'s stored code, and `{not_paused}` by the condition that keeps events of
/// paused routes out of a claim ([`crate::inbox::pause::NOT_PAUSED_SQL`]). Other braces (a JSON
/// literal `'{}'`) are left alone.
pub fn with_statuses(sql: &str) -> String {
    let sql = sql.replace("{not_paused}", crate::inbox::pause::NOT_PAUSED_SQL);
    InboxStatus::ALL.into_iter().fold(sql, |sql, status| {
        sql.replace(
            &format!("{{{}}}", status.as_str()),
            &status.code().to_string(),
        )
    })
}

/// A `&'static str` of fixed SQL whose `{ready}`, `{processing}`, `{done}` and `{dead}` are
/// the [`InboxStatus`] codes (see [`with_statuses`]), built once per process.
#[macro_export]
macro_rules! statuses_sql {
    ($sql:expr) => {{
        static SQL: ::std::sync::LazyLock<::std::string::String> =
            ::std::sync::LazyLock::new(|| $crate::prepared::with_statuses($sql));
        SQL.as_str()
    }};
}

/// One bind value with its SQL type.
#[derive(Debug)]
pub struct Bind<ST, V> {
    value: V,
    sql_type: PhantomData<ST>,
}

/// `value` bound as SQL type `ST`.
pub fn bind<ST, V>(value: V) -> Bind<ST, V> {
    Bind {
        value,
        sql_type: PhantomData,
    }
}

/// The binds of a [`CachedSql`], in placeholder order.
pub trait Binds {
    /// Pushes bind number `index` (0-based).
    fn push<'b>(&'b self, index: usize, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

macro_rules! tuple_binds {
    ($($index:tt: $st:ident $v:ident),+) => {
        impl<$($st, $v),+> Binds for ($(Bind<$st, $v>,)+)
        where
            $(Pg: HasSqlType<$st>, $v: ToSql<$st, Pg>,)+
        {
            fn push<'b>(&'b self, index: usize, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
                match index {
                    $($index => out.push_bind_param::<$st, $v>(&self.$index.value),)+
                    _ => Err(diesel::result::Error::QueryBuilderError(
                        format!("no bind for placeholder {}", index + 1).into(),
                    )),
                }
            }
        }
    };
}

/// No binds: fixed SQL without placeholders, prepared once all the same (its plan too).
impl Binds for () {
    fn push<'b>(&'b self, index: usize, _out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        Err(diesel::result::Error::QueryBuilderError(
            format!("no bind for placeholder {}", index + 1).into(),
        ))
    }
}

tuple_binds!(0: S0 V0);
tuple_binds!(0: S0 V0, 1: S1 V1);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2, 3: S3 V3);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2, 3: S3 V3, 4: S4 V4);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2, 3: S3 V3, 4: S4 V4, 5: S5 V5);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2, 3: S3 V3, 4: S4 V4, 5: S5 V5, 6: S6 V6);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2, 3: S3 V3, 4: S4 V4, 5: S5 V5, 6: S6 V6, 7: S7 V7);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2, 3: S3 V3, 4: S4 V4, 5: S5 V5, 6: S6 V6, 7: S7 V7, 8: S8 V8);
tuple_binds!(0: S0 V0, 1: S1 V1, 2: S2 V2, 3: S3 V3, 4: S4 V4, 5: S5 V5, 6: S6 V6, 7: S7 V7, 8: S8 V8, 9: S9 V9);

/// Fixed SQL with placeholders `$1`, `$2`, ... and its binds, in placeholder order. A
/// placeholder may appear more than once (its value is then sent once per use).
/// Load rows with `QueryableByName` types, as with `sql_query`.
#[derive(Debug)]
pub struct CachedSql<B> {
    sql: &'static str,
    binds: B,
}

/// `sql` with `binds`, prepared once per connection.
pub fn cached_sql<B: Binds>(sql: &'static str, binds: B) -> CachedSql<B> {
    CachedSql { sql, binds }
}

impl<B: Binds> QueryFragment<Pg> for CachedSql<B> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let mut rest = self.sql;
        while let Some(at) = rest.find('$') {
            let digits = rest[at + 1..]
                .bytes()
                .take_while(u8::is_ascii_digit)
                .count();
            let number = rest[at + 1..at + 1 + digits].parse::<usize>().ok();
            match number.and_then(|number| number.checked_sub(1)) {
                Some(index) => {
                    out.push_sql(&rest[..at]);
                    self.binds.push(index, &mut out)?;
                }
                // Not a placeholder (a `$` in a literal): kept as written.
                None => out.push_sql(&rest[..at + 1 + digits]),
            }
            rest = &rest[at + 1 + digits..];
        }
        out.push_sql(rest);
        Ok(())
    }
}

// No static id: diesel then keys its statement cache by the SQL text and bind types.
impl<B> QueryId for CachedSql<B> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<B: Binds> Query for CachedSql<B> {
    type SqlType = Untyped;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_written_as_their_codes_and_other_braces_kept() {
        assert_eq!(
            with_statuses(
                "status IN ({ready}, {processing}) AND s <> {done} OR s = {dead} AND h = '{}'"
            ),
            "status IN (0, 1) AND s <> 2 OR s = 3 AND h = '{}'"
        );
        assert_eq!(statuses_sql!("WHERE status = {dead}"), "WHERE status = 3");
    }
}
