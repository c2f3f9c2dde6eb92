//! Output: aligned tables for people, JSON for scripts, and the small formatters both use.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tensor_history::{Meta, Value};

use crate::error::{CliError, CliResult};

/// Where a command's result goes: a table or text on stdout, or JSON with `--json`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output {
    pub(crate) json: bool,
}

impl Output {
    pub(crate) fn new(json: bool) -> Output {
        Output { json }
    }

    /// Print `value` as pretty JSON.
    pub(crate) fn print_json<T: Serialize>(&self, value: &T) -> CliResult<()> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| CliError::failed(format!("writing JSON: {e}")))?;
        println!("{text}");
        Ok(())
    }
}

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A table printed with columns padded to their widest cell.
#[derive(Debug)]
pub(crate) struct Table {
    header: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[(&str, Align)]) -> Table {
        Table {
            header: header.iter().map(|(h, a)| ((*h).to_owned(), *a)).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a column after the ones given to [`Table::new`] (before any row).
    pub(crate) fn column(&mut self, name: &str, align: Align) {
        self.header.push((name.to_owned(), align));
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let n = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|(h, _)| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(n) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.header.iter().map(|(h, _)| h.clone()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (_, align)) in self.header.iter().enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                let pad = widths[i] - width(cell);
                if i > 0 {
                    line.push_str("  ");
                }
                match align {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&" ".repeat(pad));
                    }
                    Align::Right => {
                        line.push_str(&" ".repeat(pad));
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// Text from the repository, safe to print on one line: control characters escaped.
pub(crate) fn one_line(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.chars().flat_map(char::escape_default).collect()
    } else {
        s.to_owned()
    }
}

/// `1 branch`, `2 branches`: a count with its noun.
pub(crate) fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Bytes as `12.3 MiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    format!("{x:.1} {}", UNITS[unit])
}

/// A float difference in a short readable form (`0`, `1.5e-3`, `0.25`).
pub(crate) fn number(x: f64) -> String {
    if x == 0.0 {
        "0".to_owned()
    } else if x.abs() >= 1e-3 && x.abs() < 1e5 {
        format!("{x:.4}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    } else {
        format!("{x:.3e}")
    }
}

/// Seconds since the Unix epoch (fractional), for JSON.
pub(crate) fn unix_seconds(t: Option<SystemTime>) -> Option<f64> {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
}

/// A time as `2026-12-01 09:14:03` (UTC).
pub(crate) fn datetime(t: Option<SystemTime>) -> String {
    let Some(d) = t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) else {
        return "-".to_owned();
    };
    let secs = d.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A metadata value as JSON: numbers, text and flags as themselves; a NaN or infinite
/// float (which JSON cannot hold) as the text `"NaN"`, `"inf"`, `"-inf"`.
pub(crate) fn value_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Int(i) => (*i).into(),
        Value::Float(x) if x.is_finite() => (*x).into(),
        Value::Float(x) => x.to_string().into(),
        Value::Str(s) => s.clone().into(),
        Value::Bool(b) => (*b).into(),
    }
}

/// Metadata as a JSON object.
pub(crate) fn meta_json(meta: &Meta) -> serde_json::Map<String, serde_json::Value> {
    meta.iter()
        .map(|(k, v)| (k.to_owned(), value_json(v)))
        .collect()
}

/// A metadata value in a table cell: floats to 6 significant digits, text escaped.
pub(crate) fn value_cell(v: &Value) -> String {
    match v {
        Value::Float(x) if x.is_finite() && *x != 0.0 => {
            let digits = 5 - x.abs().log10().floor() as i32;
            if (0..=12).contains(&digits) {
                let s = format!("{x:.prec$}", prec = digits as usize);
                if s.contains('.') {
                    s.trim_end_matches('0').trim_end_matches('.').to_owned()
                } else {
                    s
                }
            } else {
                format!("{x:.5e}")
            }
        }
        v => one_line(&v.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tables_pad_columns_and_align_numbers_right() {
        let mut t = Table::new(&[("name", Align::Left), ("bytes", Align::Right)]);
        t.row(vec!["w".into(), "1024".into()]);
        t.row(vec!["bias".into(), "8".into()]);
        assert_eq!(t.render(), "name  bytes\nw      1024\nbias      8\n");
    }

    #[test]
    fn dates_are_utc_civil_dates() {
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_661); // 2000-02-29
        assert_eq!(datetime(Some(t)), "2000-02-29 01:01:01");
        assert_eq!(datetime(Some(UNIX_EPOCH)), "1970-01-01 00:00:00");
        assert_eq!(datetime(None), "-");
    }

    #[test]
    fn byte_counts_use_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn cells_round_floats_and_escape_text() {
        assert_eq!(value_cell(&Value::Float(0.123456789)), "0.123457");
        assert_eq!(value_cell(&Value::Float(1234.5)), "1234.5");
        assert_eq!(value_cell(&Value::Float(3.0)), "3");
        assert_eq!(value_cell(&Value::Float(1e-9)), "1.00000e-9");
        assert_eq!(value_cell(&Value::Float(f64::NAN)), "NaN");
        assert_eq!(value_cell(&Value::Str("a\nb".into())), "a\\nb");
        assert_eq!(value_cell(&Value::Int(-4)), "-4");
    }

    #[test]
    fn non_finite_floats_become_json_text() {
        assert_eq!(
            value_json(&Value::Float(f64::NAN)),
            serde_json::json!("NaN")
        );
        assert_eq!(value_json(&Value::Float(0.5)), serde_json::json!(0.5));
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(2.0e-5), "2.000e-5");
    }
}
