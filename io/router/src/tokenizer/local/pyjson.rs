//! `tojson` as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`, not Jinja's HTML-escaping filter (minijinja's own
//! `tojson` escapes `<`, `>`, `&` and `'`, which would change the prompt's
//! tokens for any tool description containing them).
//!
//! Python's choices, reproduced: `", "` and `": "` between items without an
//! indent, `","` and `": "` with one; non-ASCII characters as they are;
//! `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f` and `\u00XX` for the other
//! control characters; floats as `repr` prints them (`1.0`, `1e+16`,
//! `1e-05`), `NaN` and `Infinity` as Python writes them.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// The filter: `value | tojson`, `tojson(indent=2)`, `tojson(4)`,
/// `separators=[",", ":"]`, `sort_keys=true`, `ensure_ascii=true`.
pub(super) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_usize() {
            Some(n) => Some(" ".repeat(n)),
            None => match v.as_str() {
                Some(s) => Some(s.to_owned()),
                None => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be a number")),
            },
        },
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let mut writer = Writer { out: String::new(), indent, item, key, sort_keys, ensure_ascii };
    writer.value(value, 0)?;
    // Safe: the template's output is not HTML-escaped anyway (auto-escape
    // is off); marked so it is never escaped again.
    Ok(Value::from_safe_string(writer.out))
}

struct Writer {
    out: String,
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// Deeper than this is refused (Python raises `RecursionError` near 1,000).
const MAX_DEPTH: usize = 256;

impl Writer {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deeply"));
        }
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value)?,
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.open_close('[', ']', items.len(), depth, |w, i, d| w.value(&items[i], d))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                let mut entries = Vec::with_capacity(keys.len());
                for k in keys {
                    let v = value.get_item(&k)?;
                    entries.push((k, v));
                }
                self.open_close('{', '}', entries.len(), depth, |w, i, d| {
                    let (k, v) = &entries[i];
                    match k.as_str() {
                        Some(s) => w.string(s),
                        // Python turns int, float, bool and None keys into
                        // strings the same way `str()` would for numbers.
                        None => w.string(&k.to_string()),
                    }
                    w.out.push_str(&w.key.clone());
                    w.value(v, d)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// `[a, b]` or, with an indent, one item per line.
    fn open_close(
        &mut self,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut Writer, usize, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                let sep = self.item.clone();
                self.out.push_str(&sep);
            }
            self.newline(depth + 1);
            item(self, i, depth + 1)?;
        }
        self.newline(depth);
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn number(&mut self, value: &Value) -> Result<(), Error> {
        if value.is_integer() {
            // Integers print as they are (i128 covers every JSON integer
            // serde gave us).
            let _ = write!(self.out, "{value}");
            return Ok(());
        }
        let f = f64::try_from(value.clone())
            .map_err(|_| Error::new(ErrorKind::InvalidOperation, "tojson: not a number"))?;
        self.out.push_str(&python_float_repr(f));
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, exponent
/// form below 1e-4 and from 1e16 on, with a sign and at least two exponent
/// digits (`1e+16`, `1e-05`). Rust's `{:?}` picks the same digits and the
/// same thresholds; only the exponent's spelling differs.
pub(super) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let debug = format!("{f:?}");
    match debug.split_once('e') {
        None => debug,
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(digits) => ('-', digits),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python_writes_them() {
        let cases = [
            (1.0, "1.0"),
            (3.5, "3.5"),
            (0.1, "0.1"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (f64::INFINITY, "Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    fn dumps(template: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(template, ctx).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn matches_json_dumps() {
        let value: Value = serde_json::from_str(
            r#"{"b": [1, 2.0, true, null], "a": "x<y> & 'z' \"q\" \\ é 東\n\u0001", "e": {}, "l": []}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let ctx = minijinja::context! { v => value };
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps("{{ v | tojson }}", ctx.clone()),
            r#"{"b": [1, 2.0, true, null], "a": "x<y> & 'z' \"q\" \\ é 東\n\u0001", "e": {}, "l": []}"#
        );
        // json.dumps(v, ensure_ascii=False, indent=2)
        assert_eq!(dumps("{{ v.b | tojson(indent=2) }}", ctx.clone()), "[\n  1,\n  2.0,\n  true,\n  null\n]");
        // json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        assert_eq!(
            dumps("{{ v | tojson(separators=[',', ':'], sort_keys=true) }}", ctx.clone()),
            r#"{"a":"x<y> & 'z' \"q\" \\ é 東\n\u0001","b":[1,2.0,true,null],"e":{},"l":[]}"#
        );
        assert_eq!(dumps("{{ 'é😀' | tojson(ensure_ascii=true) }}", ctx), r#""\u00e9\ud83d\ude00""#);
    }
}
