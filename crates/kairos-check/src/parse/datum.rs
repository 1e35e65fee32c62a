//! One small data model for both input syntaxes: JSON (Kairos's own histories, adya's) and EDN
//! (Jepsen's and Elle's `history.edn`). Each record is read into a [`Datum`] and then
//! interpreted once, so the two syntaxes cannot drift apart.
//!
//! EDN is read with the `edn-format` crate. Jepsen writes one operation per line, so the text
//! is read form by form and a form may span lines; an error names the line where its form
//! began. A file that is one big vector (or list) of records is read whole.

use serde_json::Value;

use crate::CheckError;

/// A parsed value of either syntax. Keywords keep their leading colon (`:append`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Datum {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Keyword(String),
    Symbol(String),
    Seq(Vec<Datum>),
    Map(Vec<(Datum, Datum)>),
    /// Anything else (sets, instants, tagged values we do not interpret), shown as text.
    Other(String),
}

impl Datum {
    /// A map's field by name: matches the JSON string `"name"` or the keyword `:name`.
    pub fn field(&self, name: &str) -> Option<&Datum> {
        let Datum::Map(entries) = self else { return None };
        entries.iter().find_map(|(k, v)| match k {
            Datum::Str(s) if s == name => Some(v),
            Datum::Keyword(s) if s.strip_prefix(':') == Some(name) => Some(v),
            _ => None,
        })
    }

    /// A name: a string, or a keyword / symbol without its colon.
    pub fn as_name(&self) -> Option<&str> {
        match self {
            Datum::Str(s) | Datum::Symbol(s) => Some(s),
            Datum::Keyword(s) => Some(s.strip_prefix(':').unwrap_or(s)),
            _ => None,
        }
    }

    pub fn is_nil(&self) -> bool {
        matches!(self, Datum::Nil)
    }

    /// The datum as the user wrote it, short.
    pub fn show(&self) -> String {
        match self {
            Datum::Nil => "nil".into(),
            Datum::Bool(b) => b.to_string(),
            Datum::Int(i) => i.to_string(),
            Datum::Float(x) => x.to_string(),
            Datum::Str(s) => format!("{s:?}"),
            Datum::Keyword(s) | Datum::Symbol(s) | Datum::Other(s) => s.clone(),
            Datum::Seq(items) => {
                let parts: Vec<String> = items.iter().take(8).map(Datum::show).collect();
                let more = if items.len() > 8 { " …" } else { "" };
                format!("[{}{more}]", parts.join(" "))
            }
            Datum::Map(entries) => format!("{{map of {} entries}}", entries.len()),
        }
    }
}

pub(crate) fn from_json(v: &Value) -> Datum {
    match v {
        Value::Null => Datum::Nil,
        Value::Bool(b) => Datum::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Datum::Int(i.into()),
            (None, Some(u)) => Datum::Int(u.into()),
            _ => Datum::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Datum::Str(s.clone()),
        Value::Array(items) => Datum::Seq(items.iter().map(from_json).collect()),
        Value::Object(m) => Datum::Map(m.iter().map(|(k, v)| (Datum::Str(k.clone()), from_json(v))).collect()),
    }
}

fn from_edn(v: edn_format::Value) -> Datum {
    use edn_format::Value as E;
    match v {
        E::Nil => Datum::Nil,
        E::Boolean(b) => Datum::Bool(b),
        E::Integer(i) => Datum::Int(i.into()),
        E::BigInt(b) => match i128::try_from(b.clone()) {
            Ok(i) => Datum::Int(i),
            Err(_) => Datum::Other(b.to_string()),
        },
        E::Float(x) => Datum::Float(x.into_inner()),
        E::String(s) => Datum::Str(s),
        E::Character(c) => Datum::Str(c.to_string()),
        E::Keyword(k) => Datum::Keyword(edn_format::emit_str(&E::Keyword(k))),
        E::Symbol(s) => Datum::Symbol(edn_format::emit_str(&E::Symbol(s))),
        E::List(items) | E::Vector(items) => Datum::Seq(items.into_iter().map(from_edn).collect()),
        E::Map(m) => Datum::Map(m.into_iter().map(|(k, v)| (from_edn(k), from_edn(v))).collect()),
        // A record written as a tagged map (`#jepsen.history.Op{...}`) is that map.
        E::TaggedElement(_, inner) if matches!(*inner, E::Map(_)) => from_edn(*inner),
        other => Datum::Other(edn_format::emit_str(&other)),
    }
}

/// Every top-level record of a JSON text: one object per line, or one array of objects.
/// Returns (line of the record, record).
pub(crate) fn read_json(text: &str) -> Result<Vec<(usize, Datum)>, CheckError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        let all: Value = serde_json::from_str(trimmed)
            .map_err(|e| CheckError::parse(e.line(), format!("not a JSON array of records: {e}")))?;
        let Value::Array(items) = all else {
            return Err(CheckError::parse(1, "expected a JSON array of records"));
        };
        return Ok(items.iter().enumerate().map(|(i, v)| (i + 1, from_json(v))).collect());
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| CheckError::parse(i + 1, format!("not JSON: {e}")))?;
        out.push((i + 1, from_json(&v)));
    }
    Ok(out)
}

/// The text after leading white space and `;` comment lines.
fn skip_comments(text: &str) -> &str {
    let mut rest = text.trim_start();
    while rest.starts_with(';') {
        rest = rest.split_once('\n').map_or("", |(_, r)| r).trim_start();
    }
    rest
}

/// Most levels of brackets EDN may nest, as serde_json allows JSON: the EDN parser and
/// [`from_edn`] recurse once per level, so much deeper input would overflow the stack.
pub(crate) const EDN_DEPTH_MAX: usize = 128;

/// The brackets of an EDN text scanned so far, outside strings, character literals (`\(`) and
/// `;` comments: enough to tell whether a form is closed, and how deep it nests, without parsing
/// it. Feed it the text piece by piece ([`Brackets::scan`]); each byte is looked at once.
#[derive(Default)]
struct Brackets {
    /// The brackets open, innermost last (at most [`EDN_DEPTH_MAX`]).
    open: Vec<u8>,
    /// A closing bracket that matched no open one was seen: the parser will say what is wrong.
    mismatched: bool,
    in_string: bool,
    /// After a `\` inside a string.
    escaped: bool,
    /// After a `\` outside a string: the next character is a character literal.
    in_char: bool,
    in_comment: bool,
    /// Line breaks scanned.
    newlines: usize,
}

impl Brackets {
    /// Scans `text`, which continues what was scanned before. Fails with the line (1 = the first
    /// scanned) where the brackets first nest deeper than [`EDN_DEPTH_MAX`].
    fn scan(&mut self, text: &str) -> Result<(), usize> {
        for &b in text.as_bytes() {
            if b == b'\n' {
                self.newlines += 1;
            }
            if self.in_char {
                self.in_char = false;
            } else if self.in_comment {
                self.in_comment = b != b'\n';
            } else if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b';' => self.in_comment = true,
                    b'\\' => self.in_char = true,
                    b'(' | b'[' | b'{' => {
                        if self.open.len() == EDN_DEPTH_MAX {
                            return Err(self.newlines + 1);
                        }
                        self.open.push(b);
                    }
                    b')' | b']' | b'}' => {
                        let opener = match b {
                            b')' => b'(',
                            b']' => b'[',
                            _ => b'{',
                        };
                        if self.open.pop() != Some(opener) {
                            self.mismatched = true;
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Whether what was scanned is whole: every bracket closed, no string left open (or a
    /// closing bracket matched nothing, which only the parser can explain).
    fn closed(&self) -> bool {
        (self.open.is_empty() && !self.in_string && !self.in_char) || self.mismatched
    }
}

/// The error for brackets nested deeper than [`EDN_DEPTH_MAX`] on `line`.
fn too_deep(line: usize) -> CheckError {
    CheckError::parse(
        line,
        format!(
            "recursion limit exceeded: EDN brackets nest deeper than {EDN_DEPTH_MAX} levels here (a history \
             record nests a few: record, transaction, operation, value); is this a history file?"
        ),
    )
}

/// Refuses an EDN text whose brackets nest deeper than [`EDN_DEPTH_MAX`], before it is parsed.
fn check_depth(text: &str) -> Result<(), CheckError> {
    Brackets::default().scan(text).map_err(too_deep)
}

/// Every top-level record of an EDN text, with the line each began on. A text that is one
/// vector or list is the list of its elements (element numbers instead of lines).
pub(crate) fn read_edn(text: &str) -> Result<Vec<(usize, Datum)>, CheckError> {
    read_edn_counting(text, &mut 0)
}

/// [`read_edn`], adding to `bytes_parsed` the bytes handed to the EDN parser. A record that spans
/// lines is handed over once, when its brackets close: it used to be re-parsed from its start
/// after every line (10,000 lines took 47 s), so the tests hold this to the text's length.
fn read_edn_counting(text: &str, bytes_parsed: &mut usize) -> Result<Vec<(usize, Datum)>, CheckError> {
    check_depth(text)?;
    let trimmed = skip_comments(text);
    if trimmed.starts_with('[') || trimmed.starts_with('(') {
        *bytes_parsed += trimmed.len();
        let v = edn_format::parse_str(trimmed)
            .map_err(|e| CheckError::parse(1, format!("EDN syntax error in the vector of records: {}", e.error)))?;
        if let Datum::Seq(items) = from_edn(v) {
            return Ok(items.into_iter().enumerate().map(|(i, d)| (i + 1, d)).collect());
        }
        return Err(CheckError::parse(1, "expected a vector of records"));
    }
    let mut out = Vec::new();
    let mut form = String::new();
    let mut brackets = Brackets::default();
    let mut start = 0;
    for (i, line) in text.lines().enumerate() {
        if form.is_empty() {
            if line.trim().is_empty() || line.trim_start().starts_with(';') {
                continue;
            }
            start = i + 1;
            brackets = Brackets::default();
        }
        form.push_str(line);
        form.push('\n');
        brackets.scan(line).and_then(|()| brackets.scan("\n")).map_err(|_| too_deep(i + 1))?;
        if !brackets.closed() {
            continue;
        }
        *bytes_parsed += form.len();
        match edn_format::parse_str(&form) {
            Ok(v) => {
                out.push((start, from_edn(v)));
                form.clear();
            }
            // Closed brackets, yet the parser wants more (a prefix such as `#_` whose form starts
            // on a later line): read on, as before; such a prefix is parsed again with each line.
            Err(e) if e.error == edn_format::ParserError::UnexpectedEndOfInput => {}
            Err(e) => return Err(CheckError::parse(start, format!("EDN syntax error in this record: {}", e.error))),
        }
    }
    if !form.is_empty() {
        return Err(CheckError::parse(start, "EDN syntax error: this record is never closed"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deeply nested EDN is refused with the JSON reader's reason (it used to overflow the stack
    /// in the parser and abort the process), in both layouts: one vector, and one form per line.
    #[test]
    fn edn_nested_too_deep_is_refused_not_a_stack_overflow() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let per_line = format!("{{:type :invoke, :process 0, :f :txn, :value []}}\n{{:value {deep}}}\n");
        for (text, line) in [(deep.clone(), 1), (per_line, 2)] {
            let e = read_edn(&text).unwrap_err().to_string();
            assert!(e.contains("recursion limit exceeded") && e.contains(&format!("line {line}")), "{e}");
        }
        // Exactly the limit is read; brackets in strings, characters and comments do not count.
        let at_limit = format!("{}{}", "[".repeat(EDN_DEPTH_MAX), "]".repeat(EDN_DEPTH_MAX));
        assert_eq!(read_edn(&at_limit).unwrap().len(), 1);
        let over = format!("{}{}", "[".repeat(EDN_DEPTH_MAX + 1), "]".repeat(EDN_DEPTH_MAX + 1));
        assert!(read_edn(&over).is_err());
        let hidden = format!("{{:a \"{0}\" :b [\\[ \\( \\{{]}} ; {0}\n", "[".repeat(1_000));
        assert_eq!(read_edn(&hidden).unwrap().len(), 1);
    }

    /// A record over many lines is parsed once, when its brackets close, not again after every
    /// line: the bytes handed to the parser are at most the text's (they were about n² / 2).
    /// Brackets inside strings (over lines too), characters and comments do not close a record.
    #[test]
    fn a_record_over_many_lines_is_parsed_once() {
        let mut text =
            String::from("{:type :invoke, :process 0, :f :txn, :value []}\n{:type :ok, :process 0,\n :value [\n");
        for k in 0..10_000 {
            text.push_str(&format!("  [:append {k} {k}] ; ] closes nothing\n"));
        }
        text.push_str("  [:w \"a ] string\n over ] lines\" \\]]\n ]}\n#jepsen.history.Op{:type :fail\n :process 1}\n");
        let mut parsed = 0;
        let records = read_edn_counting(&text, &mut parsed).unwrap();
        assert!(parsed <= text.len(), "{parsed} bytes parsed for a text of {}", text.len());
        let lines: Vec<usize> = records.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, [1, 2, 10_007]);
        let Some(Datum::Seq(ops)) = records[1].1.field("value") else { panic!("{:?}", records[1].1.show()) };
        assert_eq!(ops.len(), 10_001);
        assert_eq!(
            ops[10_000],
            Datum::Seq(vec![
                Datum::Keyword(":w".into()),
                Datum::Str("a ] string\n over ] lines".into()),
                Datum::Str("]".into()),
            ])
        );
        assert_eq!(records[2].1.field("type"), Some(&Datum::Keyword(":fail".into())));
        // A record left open is still reported at the line it began on.
        let e = read_edn("{:type :ok\n :value [1 2\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("never closed"), "{e}");
        let e = read_edn("{:type :ok :value [}\n{:type :ok}\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("syntax error"), "{e}");
    }
}
