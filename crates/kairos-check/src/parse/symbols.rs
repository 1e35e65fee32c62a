//! Keys and values of any scalar type, mapped to the `u64` ids the checkers work on.
//!
//! Kairos's own histories use non-negative integers for keys and values; Jepsen's and Elle's
//! use keywords, strings and negative numbers too. Keys and values are two separate domains.
//! In each, when every scalar is a non-negative integer the ids are the integers themselves
//! (so reports read as before); otherwise every distinct scalar gets an id in order of first
//! appearance, and the report shows the original for each id it names. Ids compare only for
//! equality, so any injective mapping preserves every verdict.

use std::collections::HashMap;

use super::datum::Datum;

/// A scalar as written: what a key or a value can be.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Scalar {
    Int(i128),
    /// A string, keyword (with its colon), symbol, boolean or float, with its kind.
    Text(TextKind, String),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TextKind {
    Str,
    Keyword,
    Other,
}

impl Scalar {
    pub fn from_datum(d: &Datum) -> Option<Scalar> {
        Some(match d {
            Datum::Int(i) => Scalar::Int(*i),
            Datum::Str(s) => Scalar::Text(TextKind::Str, s.clone()),
            Datum::Keyword(s) => Scalar::Text(TextKind::Keyword, s.clone()),
            Datum::Symbol(s) => Scalar::Text(TextKind::Other, s.clone()),
            Datum::Bool(b) => Scalar::Text(TextKind::Other, b.to_string()),
            Datum::Float(x) => Scalar::Text(TextKind::Other, x.to_string()),
            _ => return None,
        })
    }

    fn as_id(&self) -> Option<u64> {
        match self {
            Scalar::Int(i) => u64::try_from(*i).ok(),
            Scalar::Text(..) => None,
        }
    }

    /// As shown in reports.
    fn show(&self) -> String {
        match self {
            Scalar::Int(i) => i.to_string(),
            Scalar::Text(TextKind::Str, s) => format!("{s:?}"),
            Scalar::Text(_, s) => s.clone(),
        }
    }

    /// The raw text, for models that concatenate values (a key-value store's `append`).
    fn text(&self) -> String {
        match self {
            Scalar::Int(i) => i.to_string(),
            Scalar::Text(_, s) => s.clone(),
        }
    }
}

/// One domain (keys, or values): interned scalars, or the identity on integers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interner {
    seen: Vec<Scalar>,
    ids: HashMap<Scalar, u64>,
}

impl Interner {
    pub fn note(&mut self, s: &Scalar) {
        if !self.ids.contains_key(s) {
            self.ids.insert(s.clone(), self.seen.len() as u64);
            self.seen.push(s.clone());
        }
    }

    /// The table readers use: `None` when every scalar is a non-negative integer (ids are the
    /// integers), else the scalars in id order.
    pub fn finish(self) -> Domain {
        let renamed = self.seen.iter().any(|s| s.as_id().is_none());
        if renamed {
            Domain { renamed: Some(self.seen), ids: self.ids }
        } else {
            Domain { renamed: None, ids: HashMap::new() }
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Domain {
    renamed: Option<Vec<Scalar>>,
    ids: HashMap<Scalar, u64>,
}

impl Domain {
    pub fn is_renamed(&self) -> bool {
        self.renamed.is_some()
    }

    /// How many renamed scalars (0 for the identity).
    pub fn len(&self) -> usize {
        self.renamed.as_ref().map_or(0, Vec::len)
    }

    pub fn id(&self, s: &Scalar) -> u64 {
        match &self.renamed {
            None => s.as_id().expect("identity domains hold only non-negative integers"),
            Some(_) => self.ids[s],
        }
    }
}

/// The names behind the ids of one history. Empty (identity) for Kairos's own histories.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    pub(crate) keys: Domain,
    pub(crate) values: Domain,
}

impl Symbols {
    /// Whether keys or values were renamed to ids.
    pub fn renamed(&self) -> bool {
        self.keys.renamed.is_some() || self.values.renamed.is_some()
    }

    pub fn key_name(&self, id: u64) -> String {
        name(&self.keys, id)
    }

    pub fn value_name(&self, id: u64) -> String {
        name(&self.values, id)
    }

    /// A value's raw text (an integer's decimal digits).
    pub fn value_text(&self, id: u64) -> String {
        match &self.values.renamed {
            None => id.to_string(),
            Some(v) => v.get(id as usize).map_or_else(|| id.to_string(), Scalar::text),
        }
    }

    /// A legend of renamed keys and values, at most `max` entries each.
    pub fn legend(&self, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        for (what, d) in [("key", &self.keys), ("value", &self.values)] {
            if let Some(v) = &d.renamed {
                let shown: Vec<String> =
                    v.iter().take(max).enumerate().map(|(i, s)| format!("{i} = {}", s.show())).collect();
                let more = if v.len() > max { format!(" … ({} in all)", v.len()) } else { String::new() };
                out.push(format!(
                    "{what}s are not all non-negative integers, so reports name them by id: {}{more}",
                    shown.join(", ")
                ));
            }
        }
        out
    }
}

fn name(d: &Domain, id: u64) -> String {
    match &d.renamed {
        None => id.to_string(),
        Some(v) => v.get(id as usize).map_or_else(|| id.to_string(), Scalar::show),
    }
}
