//! Text the crate prints (graphs, error messages) with characters that could forge or
//! hide output escaped: one user string never spans two lines or reorders a line.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is printed escaped: control characters (line breaks, tabs, escape
/// sequences), the Unicode line and paragraph separators, and the invisible characters
/// that reorder or hide text (bidirectional overrides and isolates, zero-width marks).
pub(crate) fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `s` with every character of [`needs_escape`] written as `\n`, `\r`, `\t` or
/// `\u{hex}`; borrowed when nothing needs escaping. O(len).
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escape_leaves_plain_text_borrowed_and_escapes_line_breaks_and_overrides() {
        assert!(matches!(
            escape("plain text, ünïcode"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape("a\nb\r\tc"), "a\\nb\\r\\tc");
        assert_eq!(escape("x\u{1b}[2J"), "x\\u{1b}[2J");
        assert_eq!(escape("evil\u{202e}txt"), "evil\\u{202e}txt");
        assert_eq!(escape("l\u{2028}m"), "l\\u{2028}m");
    }
}
