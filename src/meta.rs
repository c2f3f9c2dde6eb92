//! Version metadata: a small map of named values (step, loss, learning rate, seed) kept
//! with each version.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One named value of a version's [`Meta`].
///
/// Equality is exact and bitwise for floats (`Float(NaN) == Float(NaN)`, `Float(0.0) !=
/// Float(-0.0)`), so a value equals itself after a save and a load.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Value {
    /// A signed integer (a step, an epoch, a seed).
    Int(i64),
    /// A float (a loss, an accuracy, a learning rate); NaN and infinities are kept as they
    /// are, but a NaN never ranks in [`Retention::keep_best`](crate::Retention::keep_best).
    Float(f64),
    /// Text (a data order, a note).
    Str(String),
    /// A flag.
    Bool(bool),
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Value {}

impl Value {
    /// The value as a number: `Int` and `Float` (an `i64` beyond 2^53 is rounded), `None`
    /// for text and flags. O(1).
    #[must_use]
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Int(i) => Some(i as f64),
            Value::Float(x) => Some(x),
            Value::Str(_) | Value::Bool(_) => None,
        }
    }

    /// The integer of an `Int`. O(1).
    #[must_use]
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Int(i) => Some(i),
            _ => None,
        }
    }

    /// The text of a `Str`. O(1).
    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The flag of a `Bool`. O(1).
    #[must_use]
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The type's name: `int`, `float`, `str` or `bool`. O(1).
    #[must_use]
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bool(_) => "bool",
        }
    }
}

/// Integers print as `3`, floats in their shortest exact form with a decimal point or an
/// exponent (`0.12`, `3.0`, `1e-5`, `NaN`), text as it is, flags as `true`/`false`.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => f.write_str(s),
            Value::Bool(b) => write!(f, "{b}"),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident($conv:expr)),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$variant($conv(v))
            }
        })*
    };
}

value_from! {
    i64 => Int(i64::from),
    i32 => Int(i64::from),
    u32 => Int(i64::from),
    f64 => Float(f64::from),
    bool => Bool(bool::from),
    String => Str(String::from),
    &str => Str(String::from),
}

/// An `f32` becomes the `f64` nearest its shortest decimal form, so `0.1f32` is recorded
/// (and shown) as `0.1`, not as `0.10000000149011612`.
impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::Float(if v.is_finite() {
            v.to_string().parse().unwrap_or(f64::from(v))
        } else {
            f64::from(v)
        })
    }
}

/// The metadata of one version: named [`Value`]s, sorted by name.
///
/// Keys are non-empty and hold no white space, control characters, `=` or `"`, so that
/// `key=value` text reads back unambiguously; [`Store::commit_with`](crate::Store::commit_with)
/// refuses other keys. Text values with spaces or special characters are shown quoted and
/// escaped.
///
/// ```
/// use tensor_history::{Meta, Value};
/// let meta = Meta::new().with("step", 3).with("loss", 0.12).with("note", "warm up");
/// assert_eq!(meta.get("step"), Some(&Value::Int(3)));
/// assert_eq!(meta.number("loss"), Some(0.12));
/// assert_eq!(meta.to_string(), r#"loss=0.12 note="warm up" step=3"#);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Meta(BTreeMap<String, Value>);

impl Meta {
    /// No values. O(1).
    #[must_use]
    pub fn new() -> Meta {
        Meta::default()
    }

    /// The same map with `key` set to `value` (builder style). O(log keys).
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Meta {
        self.insert(key, value);
        self
    }

    /// Set `key` to `value`, returning the old value. O(log keys).
    pub fn insert(&mut self, key: &str, value: impl Into<Value>) -> Option<Value> {
        self.0.insert(key.to_owned(), value.into())
    }

    /// Remove `key`, returning its value. O(log keys).
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key)
    }

    /// The value of `key`. O(log keys).
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// The value of `key` as a number (see [`Value::as_f64`]); `None` when it is absent,
    /// not a number, or NaN. O(log keys).
    #[must_use]
    pub fn number(&self, key: &str) -> Option<f64> {
        self.get(key)
            .and_then(Value::as_f64)
            .filter(|x| !x.is_nan())
    }

    /// The values a person reads in [`Store::log_graph`](crate::Store::log_graph) and
    /// [`Store::to_dot`](crate::Store::to_dot): every key but those that begin with `_`,
    /// which mark a library's own records (the PyTorch tracker's optimizer state, for
    /// one). Such keys are kept, saved and returned like any other. O(keys).
    #[must_use]
    pub fn shown(&self) -> Meta {
        Meta(
            self.0
                .iter()
                .filter(|(k, _)| !k.starts_with('_'))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }

    /// The keys and values, sorted by key. O(1) to start.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The number of values. O(1).
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no values. O(1).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Check every key (see the type docs). O(keys · key length).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the first bad key.
    pub fn validate(&self) -> Result<()> {
        match self.0.keys().find(|k| !valid_key(k)) {
            None => Ok(()),
            Some(k) => Err(Error::InvalidArgument {
                reason: format!(
                    "metadata key {k:?} must be non-empty, without white space, control \
                     characters, `=` or `\"`"
                ),
            }),
        }
    }
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && !k
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '=' || c == '"')
}

/// Whether a text value must be quoted to read back as one `key=value` token.
fn needs_quotes(s: &str) -> bool {
    s.is_empty()
        || s.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '"' | '\\' | '=' | '[' | ']')
        })
}

/// `key=value` pairs separated by spaces, sorted by key; text that needs it is quoted and
/// escaped (`note="a \"b\"\n"`), so the line never holds a control character.
impl fmt::Display for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            // Keys are checked on commit; escape anyway so a bad key cannot break a line.
            if valid_key(k) {
                write!(f, "{k}=")?;
            } else {
                write!(f, "{k:?}=")?;
            }
            match v {
                Value::Str(s) if needs_quotes(s) => write!(f, "{s:?}")?,
                v => write!(f, "{v}")?,
            }
        }
        Ok(())
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for Meta {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Meta {
        Meta(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl<'a> IntoIterator for &'a Meta {
    type Item = (&'a String, &'a Value);
    type IntoIter = std::collections::btree_map::Iter<'a, String, Value>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for Meta {
    type Item = (String, Value);
    type IntoIter = std::collections::btree_map::IntoIter<String, Value>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}
