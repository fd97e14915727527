//! Text that clients or policy authors chose, made safe to show to an operator.

use std::borrow::Cow;

/// `text` as it is safe to show on an operator's terminal or in a label: every character that
/// does not print as itself (control characters, newlines and carriage returns,
/// escape sequences' ESC, bidirectional overrides, invisible formatting characters)
/// written as its Rust escape (`\n`, `\u{1b}`, `\u{202e}`), and a backslash as
/// `\\`, so two distinct keys never show as one. Counter keys and top offenders
/// carry values clients chose: shown raw, a value could clear the screen, set the
/// title or write the clipboard, reorder a line, or pose as another key. Borrowed
/// when there is nothing to escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c == '\\' || hidden(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if hidden(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether `c` does not show as a glyph of its own: a control character (C0, DEL,
/// C1), a line or paragraph separator, or a format character that reorders text
/// (bidirectional marks, embeddings, overrides and isolates) or is invisible
/// (zero-width spaces and joiners, the soft hyphen, the byte order mark).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_what_would_act_on_the_terminal_and_keeps_the_rest() {
        for clean in ["10.0.0.1", "/login", "tenant=acme|x", "café 東京", "аdmin"] {
            assert!(matches!(printable(clean), Cow::Borrowed(_)), "{clean}");
        }
        for (raw, shown) in [
            ("alice\nlevel=INFO", "alice\\nlevel=INFO"),
            ("bob\rcarol", "bob\\rcarol"),
            ("\u{1b}[2J\u{1b}[H", "\\u{1b}[2J\\u{1b}[H"),
            ("\u{1b}]52;c;aGk=\u{7}", "\\u{1b}]52;c;aGk=\\u{7}"),
            ("nul\0\u{7f}\u{9b}", "nul\\0\\u{7f}\\u{9b}"),
            ("user\u{202e}gnp.exe", "user\\u{202e}gnp.exe"),
            ("adm\u{200b}in", "adm\\u{200b}in"),
            ("line\u{2028}", "line\\u{2028}"),
            // A backslash is doubled, so that no raw value shows as an escaped one.
            ("a\\nb", "a\\\\nb"),
        ] {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
        assert_ne!(printable("a\\nb"), printable("a\nb"));
    }
}
