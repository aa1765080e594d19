//! The event list (filters, keyset pages) and one event's detail. Everything shown comes from
//! a webhook's sender and is escaped; bodies are shown as text, as received, never
//! interpreted.

use actix_web::{web, HttpResponse};
use inbox_core::operations::browse;
use inbox_core::operations::EventSummary;
use inbox_core::InboxStatus;
use maud::{html, Markup};
use serde::Deserialize;

use super::filter::FilterParams;
use super::layout;
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;

/// Rows per page.
pub const PAGE_SIZE: i64 = 50;

/// The list's query string: the filter and the page cursor.
#[derive(Debug, Deserialize)]
pub struct ListParams {
    #[serde(flatten)]
    filter: FilterParams,
    /// The last id of the previous page.
    before: Option<i64>,
}

/// GET /events.
pub async fn list(
    user: CurrentUser,
    state: web::Data<AppState>,
    params: web::Query<ListParams>,
) -> Result<HttpResponse, ConsoleError> {
    let query = params.filter.to_query()?;
    let mut rows = state
        .query_events(&query, async |conn| {
            browse::list_page(conn, &query, params.before, PAGE_SIZE + 1).await
        })
        .await?;
    let more = rows.len() > usize::try_from(PAGE_SIZE).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(PAGE_SIZE).unwrap_or(usize::MAX));
    let filter = &params.filter;
    let content = html! {
        (filter_form(filter))
        @if user.can_repair(&state) {
            p { a id="replay-matching" href={ "/replay?" (filter.query_string()) } { "Replay the dead events matching this filter…" } }
        }
        table id="events" {
            tr { th { "id" } th { "provider" } th { "event id" } th { "type" } th { "state" } th { "attempts" } th { "received" } th { "last error" } }
            @for row in &rows { (event_row(row)) }
        }
        @if rows.is_empty() { p { "No event matches." } }
        @if more {
            @if let Some(last) = rows.last() {
                @let filters = filter.query_string();
                p { a id="next-page" href={ "/events?" (filters) @if !filters.is_empty() { "&" } "before=" (last.id) } { "Older events →" } }
            }
        }
    };
    Ok(layout::page("Events", &user, &state, content))
}

fn filter_form(filter: &FilterParams) -> Markup {
    html! {
        form.filters method="get" action="/events" {
            label { "provider" input type="text" name="provider" value=(filter.provider); }
            label { "type" input type="text" name="type" value=(filter.event_type); }
            label { "state"
                select name="state" {
                    option value="" { "any" }
                    @for status in InboxStatus::ALL {
                        option value=(status.as_str()) selected[filter.state == status.as_str()] { (status.as_str()) }
                    }
                }
            }
            label { "received since (UTC)" input type="text" name="since" placeholder="2026-12-01T10:00" value=(filter.since); }
            label { "until" input type="text" name="until" value=(filter.until); }
            label { "event id" input type="text" name="event_id" value=(filter.event_id); }
            label { "body contains (JSON)" input type="text" name="body" size="30" placeholder=r#"{"type": "charge.failed"}"# value=(filter.body); }
            button type="submit" id="apply-filter" { "Filter" }
        }
    }
}

fn event_row(row: &EventSummary) -> Markup {
    html! {
        tr {
            td { a href={ "/events/" (row.id) } { (row.id) } }
            td { (row.provider) }
            td { (row.event_id) }
            td { (row.event_type.as_deref().unwrap_or("")) }
            td.{ "state-" (row.status.as_str()) } { (row.status.as_str()) }
            td.num { (row.attempt) }
            td { (row.received_at.format("%Y-%m-%d %H:%M:%S")) }
            td { (row.last_error.as_deref().map(|e| cut(e, 120)).unwrap_or_default()) }
        }
    }
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((index, _)) => format!("{}…", &text[..index]),
        None => text.to_owned(),
    }
}

/// Words that mark a header as credential-like: a header whose name contains one (in any
/// case) has its value hidden, should a sender have put a credential there. Broad on purpose:
/// hiding a harmless value costs less than showing a secret to every viewer. `auth` covers
/// `Authorization` and `X-Auth`, `key` covers `X-Api-Key`, `apikey` and `api_key`; a
/// signature or HMAC, with the body shown beside it, would let a viewer send the delivery again.
const HIDDEN_HEADER_WORDS: [&str; 11] = [
    "auth",
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "signature",
    "hmac",
    "cookie",
    "session",
];

/// The stored headers as `name: value` lines, credentials masked.
pub fn header_lines(headers: &serde_json::Value) -> Vec<(String, String)> {
    let Some(object) = headers.as_object() else {
        return Vec::new();
    };
    object
        .iter()
        .map(|(name, value)| {
            let lower = name.to_ascii_lowercase();
            let shown = if HIDDEN_HEADER_WORDS.iter().any(|word| lower.contains(word)) {
                "[hidden]".to_owned()
            } else {
                match value {
                    serde_json::Value::String(text) => text.clone(),
                    other => other.to_string(),
                }
            };
            (name.clone(), shown)
        })
        .collect()
}

/// The body for reading, always the bytes as received: invalid UTF-8 replaced, and valid JSON
/// re-indented, nothing else. Values are never parsed and printed again, which would collapse
/// duplicate keys, round big numbers, rewrite `1e2` as `100.0` and reorder keys: the page must
/// show what the sender sent. Either way it is shown as escaped text.
pub fn readable_body(body: &[u8]) -> String {
    // A syntax check only: nothing of the parsed value is kept.
    let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    let text = String::from_utf8_lossy(body);
    if is_json {
        reindent_json(&text)
    } else {
        text.into_owned()
    }
}

/// Valid JSON `text` with its whitespace outside strings replaced by two-space indentation,
/// one member or element per line; every other character is kept as it is.
fn reindent_json(text: &str) -> String {
    fn new_line(out: &mut String, depth: usize) {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    }
    let is_space = |c: &char| matches!(c, ' ' | '\t' | '\n' | '\r');
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            c if is_space(&c) => {}
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.next_if(is_space).is_some() {}
                // An empty object or array stays on its line.
                if let Some(close) = chars.next_if(|next| matches!(next, '}' | ']')) {
                    out.push(close);
                } else {
                    depth += 1;
                    new_line(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                new_line(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                new_line(&mut out, depth);
            }
            ':' => out.push_str(": "),
            other => out.push(other),
        }
    }
    out
}

/// GET /events/{id}.
pub async fn detail(
    user: CurrentUser,
    state: web::Data<AppState>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ConsoleError> {
    let mut conn = state.connection().await?;
    let event = browse::event_by_id(&mut conn, *id)
        .await?
        .ok_or(ConsoleError::NotFound)?;
    let ordering = browse::ordering_of(&mut conn, *id).await?;
    drop(conn);
    let summary = &event.summary;
    let time = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string();
    let content = html! {
        table id="event" {
            tr { th { "row id" } td { (summary.id) } }
            tr { th { "provider" } td { (summary.provider) } }
            tr { th { "event id" } td id="event-id" { (summary.event_id) } }
            tr { th { "type" } td { (summary.event_type.as_deref().unwrap_or("")) } }
            tr { th { "state" } td.{ "state-" (summary.status.as_str()) } id="state" { (summary.status.as_str()) } }
            tr { th { "received" } td { (time(summary.received_at)) } }
            tr { th { "attempts begun" } td { (summary.attempt) } }
            @if summary.status == InboxStatus::Ready { tr { th { "next attempt" } td { (time(summary.next_attempt_at)) } } }
            @if let Some(processed) = summary.processed_at { tr { th { "finished" } td { (time(processed)) } } }
            tr { th { "lease holder (last worker)" } td { (summary.locked_by.as_deref().unwrap_or("none")) } }
            @if let Some(until) = event.locked_until { tr { th { "lease expires" } td { (time(until)) } } }
            tr { th { "last attempt's error" } td id="last-error" { (summary.last_error.as_deref().unwrap_or("none")) } }
            @if let Some(ordering) = &ordering {
                tr { th { "ordering key" } td id="ordering-key" { (ordering.ordering_key) " (sequence " (ordering.ordering_sequence) ")" } }
            }
        }
        p.notice { "The inbox keeps each event's attempt count and its latest outcome; earlier attempts' errors are in the worker's log." }
        @if summary.status == InboxStatus::Dead && user.can_repair(&state) {
            form method="post" action={ "/events/" (summary.id) "/replay" } {
                (layout::csrf_field(&user))
                button type="submit" id="replay-one" { "Replay this event" }
            }
        }
        h2 { "Headers" }
        table id="headers" {
            @for (name, value) in header_lines(&event.headers) { tr { th { (name) } td { (value) } } }
        }
        h2 { "Body (" (event.body.len()) " bytes)" }
        pre id="body" { (readable_body(&event.body)) }
    };
    Ok(layout::page(
        &format!("Event {}", summary.id),
        &user,
        &state,
        content,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_headers_are_hidden_and_bodies_stay_text() {
        let headers = serde_json::json!({"X-Api-Key": "k", "Stripe-Signature": "t=1,v1=ab", "x-auth-token": "t", "User-Agent": "Stripe/1.0"});
        let lines = header_lines(&headers);
        let value = |name: &str| {
            lines
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(value("X-Api-Key").as_deref(), Some("[hidden]"));
        assert_eq!(value("x-auth-token").as_deref(), Some("[hidden]"));
        assert_eq!(value("Stripe-Signature").as_deref(), Some("[hidden]"));
        assert_eq!(value("User-Agent").as_deref(), Some("Stripe/1.0"));
        assert_eq!(readable_body(br#"{"a":1}"#), "{\n  \"a\": 1\n}");
        assert_eq!(
            readable_body(br#" {"b" : [1, {}, [ ], "x, \"y\" {z}"],"a":{"c":null}} "#),
            "{\n  \"b\": [\n    1,\n    {},\n    [],\n    \"x, \\\"y\\\" {z}\"\n  ],\n  \"a\": {\n    \"c\": null\n  }\n}"
        );
        assert_eq!(readable_body(b"a=1&b=\xff"), "a=1&b=\u{fffd}");
        assert_eq!(cut("abcdef", 3), "abc…");
    }
}
