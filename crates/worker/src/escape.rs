//! What the operator commands print of an event is mostly chosen by whoever sent the webhook
//! (event ids, types, headers, the body): control characters in it must not drive the
//! operator's terminal (clear the screen, rewrite earlier lines, set the window title, hide
//! text with bidirectional overrides). They are shown as `\u{..}` escapes instead.

use std::borrow::Cow;

/// Bidirectional formatting characters: they reorder what the terminal shows.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape_unless(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| (c.is_control() || is_bidi_control(c)) && !keep(c);
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// A value printed on one line: every control character escaped, newlines included.
pub fn line(text: &str) -> Cow<'_, str> {
    escape_unless(text, |_| false)
}

/// A block of text (a body): control characters escaped except newlines and tabs.
pub fn block(text: &str) -> Cow<'_, str> {
    escape_unless(text, |c| c == '\n' || c == '\t')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_escaped_and_plain_text_is_untouched() {
        assert_eq!(line("evt_1 café"), "evt_1 café");
        assert!(matches!(line("evt_1"), Cow::Borrowed(_)));
        assert_eq!(line("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(line("one\ntwo\rthree"), "one\\u{a}two\\u{d}three");
        assert_eq!(
            line("\u{9b}31m"),
            "\\u{9b}31m",
            "C1 control sequence introducer"
        );
        assert_eq!(
            line("abc\u{202e}fed"),
            "abc\\u{202e}fed",
            "right-to-left override"
        );
        assert_eq!(
            block("{\n\t\"a\": \"\u{7}\"\n}"),
            "{\n\t\"a\": \"\\u{7}\"\n}"
        );
    }
}
