//! Text the store prints: one line per version whatever the messages hold, error messages
//! that stay on one line, and ref names that can neither forge output nor hide a version.

use ndarray::array;
use tensor_history::{Error, Store, VersionId};

fn store_with(message: &str) -> Store {
    let mut s = Store::new();
    s.insert("w", &array![1.0f32]).unwrap();
    s.commit("init").unwrap();
    s.commit(message).unwrap();
    s
}

#[test]
fn log_graph_keeps_a_message_with_newlines_on_one_line() {
    let s = store_with("x\n* v9 (HEAD -> main) forged\r\n");
    let graph = s.log_graph();
    assert_eq!(
        graph,
        "* v1 (HEAD -> main) x\\n* v9 (HEAD -> main) forged\\r\\n\n* v0 init\n"
    );
    assert_eq!(graph.lines().count(), s.versions().len());
    // The message itself is kept as given.
    assert!(s.message(VersionId(1)).unwrap().contains('\n'));
}

#[test]
fn log_graph_escapes_terminal_escapes_and_bidi_overrides() {
    let s = store_with("\u{1b}[2J\u{202e}gnp.exe\u{2028}x");
    assert_eq!(
        s.log_graph().lines().next().unwrap(),
        "* v1 (HEAD -> main) \\u{1b}[2J\\u{202e}gnp.exe\\u{2028}x"
    );
}

#[test]
fn to_dot_escapes_control_characters_inside_its_quoted_labels() {
    let s = store_with("a\"b\\c\nd\u{1b}e");
    let dot = s.to_dot();
    assert!(
        dot.contains(r#"[label="v1\na\"b\\c\nd\\u{1b}e"];"#),
        "{dot}"
    );
    assert!(!dot.contains('\u{1b}'));
}

#[test]
fn error_messages_show_caller_text_on_one_line() {
    let mut s = Store::new();
    let err = s.remove("evil\nline").unwrap_err();
    assert!(matches!(&err, Error::UnknownVariable { name } if name == "evil\nline"));
    assert_eq!(err.to_string(), "unknown variable `evil\\nline`");
    let err = s.resolve("a\u{1b}[1mb").unwrap_err();
    assert_eq!(err.to_string(), "unknown ref `a\\u{1b}[1mb`");
    s.insert("t\tab", &array![1u8]).unwrap();
    let err = s.get::<f32>("t\tab").unwrap_err();
    assert!(!err.to_string().contains('\t'), "{err}");
}

#[test]
fn ref_names_that_read_as_version_ids_are_refused() {
    let mut s = store_with("second");
    let v0 = VersionId(0);
    for name in ["v1", "v0", "12", "v007", "0"] {
        assert!(
            matches!(s.tag(name, v0), Err(Error::InvalidRefName { .. })),
            "{name}"
        );
        assert!(
            matches!(s.branch(name, v0), Err(Error::InvalidRefName { .. })),
            "{name}"
        );
    }
    assert_eq!(s.resolve("v1").unwrap(), VersionId(1));
    // Names that merely start like an id are fine.
    for name in ["v", "v1.0", "v1-best", "1e3", "vx"] {
        s.tag(name, v0).unwrap();
        assert_eq!(s.resolve(name).unwrap(), v0, "{name}");
    }
}

#[test]
fn ref_names_with_invisible_or_control_characters_are_refused() {
    let mut s = store_with("second");
    for name in ["a\u{202e}b", "zero\u{200b}width", "bell\u{7}", "nl\n"] {
        assert!(
            matches!(s.tag(name, VersionId(0)), Err(Error::InvalidRefName { .. })),
            "{name:?}"
        );
    }
}

#[test]
fn resolve_gives_version_errors_for_ids_that_are_not_live() {
    let s = store_with("second");
    assert!(matches!(
        s.resolve("v5"),
        Err(Error::UnknownVersion { id }) if id == VersionId(5)
    ));
    assert!(matches!(s.resolve("nope"), Err(Error::UnknownRef { .. })));
}

#[test]
fn log_graph_and_dot_hide_metadata_keys_that_begin_with_an_underscore() {
    let mut s = Store::new();
    s.insert("w", &array![1.0f32]).unwrap();
    let meta = tensor_history::Meta::new()
        .with("loss", 0.5)
        .with("_tracker.state", "{\"groups\": [1, 2, 3]}");
    let v = s.commit_with("step", meta).unwrap();
    assert_eq!(s.log_graph(), "* v0 (HEAD -> main) step [loss=0.5]\n");
    assert!(s.to_dot().contains("loss=0.5") && !s.to_dot().contains("_tracker"));
    // Kept and returned as any other key.
    let m = s.metadata(v).unwrap();
    assert_eq!(
        m.get("_tracker.state").and_then(|x| x.as_str()),
        Some("{\"groups\": [1, 2, 3]}")
    );
    // Only underscore keys: no empty brackets.
    s.commit_with("internal only", tensor_history::Meta::new().with("_x", 1))
        .unwrap();
    assert!(s
        .log_graph()
        .starts_with("* v1 (HEAD -> main) internal only\n"));
}
