//! The history tree as text (like `git log --graph --oneline`) and as Graphviz DOT.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use crate::error::Result;
use crate::history::{Head, Ref};
use crate::store::Store;
use crate::text;
use crate::version::VersionId;

impl Store {
    fn labels(&self) -> BTreeMap<VersionId, Vec<String>> {
        let mut labels: BTreeMap<VersionId, Vec<String>> = BTreeMap::new();
        let head_branch = self.hist.head_branch();
        if let Head::Detached(v) = self.hist.head {
            labels.entry(v).or_default().push("HEAD".into());
        }
        for (name, r) in &self.hist.refs {
            let text = match r {
                Ref::Branch(_) if head_branch == Some(name.as_str()) => {
                    format!("HEAD -> {}", text::escape(name))
                }
                Ref::Branch(_) => text::escape(name).into_owned(),
                Ref::Tag(_) => format!("tag: {}", text::escape(name)),
            };
            let list = labels.entry(r.target()).or_default();
            if text.starts_with("HEAD") {
                list.insert(0, text);
            } else {
                list.push(text);
            }
        }
        labels
    }

    /// The history tree as text, newest first, like `git log --graph --oneline`: one line
    /// per live version with its id, refs, message and metadata (`[loss=0.12 step=3]`, see
    /// [`Meta`](crate::Meta)'s `Display`; keys that begin with `_` are not shown, see
    /// [`Meta::shown`](crate::Meta::shown)), and lanes that show where branches fork and
    /// merges join. A message (and metadata) is shown on its one line with control
    /// characters, line separators and invisible reordering characters escaped (`\n`,
    /// `\t`, `\u{1b}`), so no message can draw a line of its own. O(versions · lanes).
    ///
    /// ```
    /// # use tensor_history::Store;
    /// # use ndarray::array;
    /// let mut store = Store::new();
    /// store.insert("w", &array![1.0f32])?;
    /// let v0 = store.commit("init")?;
    /// store.commit("step")?;
    /// assert_eq!(store.log_graph(), "* v1 (HEAD -> main) step\n* v0 init\n");
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    #[must_use]
    pub fn log_graph(&self) -> String {
        let labels = self.labels();
        let mut out = String::new();
        // Each lane waits for the version it will show next.
        let mut lanes: Vec<Option<VersionId>> = Vec::new();
        let nodes: Vec<_> = self.hist.live().rev().collect();
        for (id, node) in nodes {
            let mine: Vec<usize> = (0..lanes.len()).filter(|&i| lanes[i] == Some(id)).collect();
            let col = match mine.first() {
                Some(&c) => c,
                None => match lanes.iter().position(Option::is_none) {
                    Some(free) => {
                        lanes[free] = Some(id);
                        free
                    }
                    None => {
                        lanes.push(Some(id));
                        lanes.len() - 1
                    }
                },
            };
            // Lanes that also waited for this version join it (a fork point): `|/`.
            if mine.len() > 1 {
                for &j in &mine[1..] {
                    lanes[j] = None;
                }
                let _ = writeln!(out, "{}", connector(&lanes, &mine[1..], '/'));
                while lanes.last() == Some(&None) {
                    lanes.pop();
                }
            }
            let mut line = String::new();
            for (i, lane) in lanes.iter().enumerate() {
                let mark = if i == col {
                    '*'
                } else if lane.is_some() {
                    '|'
                } else {
                    ' '
                };
                line.push(mark);
                line.push(' ');
            }
            let refs = labels
                .get(&id)
                .map(|l| format!("({}) ", l.join(", ")))
                .unwrap_or_default();
            let shown = node.meta.shown();
            let meta = if shown.is_empty() {
                String::new()
            } else {
                format!(" [{}]", text::escape(&shown.to_string()))
            };
            let message = text::escape(&node.message);
            let _ = writeln!(out, "{line}{id} {refs}{message}{meta}");
            lanes[col] = node.parents.first().copied();
            // Extra parents (a merge) open lanes of their own unless one already waits.
            let mut opened = Vec::new();
            for p in node.parents.iter().skip(1) {
                if lanes.contains(&Some(*p)) {
                    continue;
                }
                let slot = match lanes.iter().position(Option::is_none) {
                    Some(free) => free,
                    None => {
                        lanes.push(None);
                        lanes.len() - 1
                    }
                };
                lanes[slot] = Some(*p);
                opened.push(slot);
            }
            if !opened.is_empty() {
                let _ = writeln!(out, "{}", connector(&lanes, &opened, '\\'));
            }
            while lanes.last() == Some(&None) {
                lanes.pop();
            }
        }
        out
    }

    /// The history tree as a Graphviz DOT digraph: one node per live version (id,
    /// message and metadata), an edge from each version to its parents, refs as boxes.
    /// Quotes and backslashes are escaped, a message's line breaks become DOT line breaks
    /// inside its node, and other control or invisible characters are shown as
    /// `\u{hex}`. O(versions).
    #[must_use]
    pub fn to_dot(&self) -> String {
        self.dot_of(None)
    }

    /// Like [`to_dot`](Store::to_dot), showing only `id` and its ancestors (and the refs
    /// and HEAD that point at them). O(versions).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`](crate::Error::UnknownVersion),
    /// [`Error::PrunedVersion`](crate::Error::PrunedVersion).
    pub fn to_dot_from(&self, id: VersionId) -> Result<String> {
        let shown: HashSet<VersionId> = self.hist.ancestors(id)?.into_iter().collect();
        Ok(self.dot_of(Some(&shown)))
    }

    fn dot_of(&self, only: Option<&HashSet<VersionId>>) -> String {
        let shown = |id: &VersionId| only.is_none_or(|s| s.contains(id));
        let mut out = String::from("digraph history {\n  rankdir=BT;\n  node [shape=ellipse];\n");
        for (id, node) in self.hist.live().filter(|(id, _)| shown(id)) {
            let shown = node.meta.shown();
            let meta = if shown.is_empty() {
                String::new()
            } else {
                format!("\\n{}", escape(&shown.to_string()))
            };
            let _ = writeln!(
                out,
                "  {} [label=\"{}\\n{}{meta}\"];",
                id.0,
                id,
                escape(&node.message)
            );
            for p in &node.parents {
                let _ = writeln!(out, "  {} -> {};", id.0, p.0);
            }
        }
        for (name, r) in self.hist.refs.iter().filter(|(_, r)| shown(&r.target())) {
            let (shape, label) = match r {
                Ref::Branch(_) => ("box", name.clone()),
                Ref::Tag(_) => ("note", format!("tag: {name}")),
            };
            let _ = writeln!(
                out,
                "  \"ref:{0}\" [shape={shape}, label=\"{1}\"];\n  \"ref:{0}\" -> {2} [style=dashed];",
                escape(name),
                escape(&label),
                r.target().0
            );
        }
        if let Some(h) = self.hist.head_id().filter(shown) {
            let _ = writeln!(
                out,
                "  HEAD [shape=box, style=bold];\n  HEAD -> {} [style=dashed];",
                h.0
            );
        }
        out.push_str("}\n");
        out
    }
}

/// A line between two rows of the graph: `|` for each live lane, and `mark` (`\\` for a
/// lane a merge opens, `/` for a lane that joins at a fork) just left of each lane in
/// `moving`, as `git log --graph` draws them.
fn connector(lanes: &[Option<VersionId>], moving: &[usize], mark: char) -> String {
    let mut line: Vec<char> = vec![' '; lanes.len() * 2 + 2];
    for (i, lane) in lanes.iter().enumerate() {
        if lane.is_some() && !moving.contains(&i) {
            line[2 * i] = '|';
        }
    }
    for &j in moving {
        line[(2 * j).saturating_sub(1)] = mark;
    }
    line.into_iter().collect::<String>().trim_end().to_owned()
}

/// `s` as the inside of a DOT quoted string (see [`Store::to_dot`]).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if text::needs_escape(c) => {
                let _ = write!(out, "\\\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}
