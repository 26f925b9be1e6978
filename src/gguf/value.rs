//! GGUF metadata values, kept with their exact on-disk type so they round-trip byte for byte.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_u32(v: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Smallest encoding of one value of this type (strings: the u64 length; arrays: type + count).
    /// Used to bound element counts by the bytes actually left in the file.
    pub fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A GGUF string: bytes as stored (normally UTF-8, but kept raw so odd vocabularies round-trip).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct GString(pub Vec<u8>);

impl GString {
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl From<&str> for GString {
    fn from(s: &str) -> Self {
        GString(s.as_bytes().to_vec())
    }
}

impl From<String> for GString {
    fn from(s: String) -> Self {
        GString(s.into_bytes())
    }
}

impl fmt::Debug for GString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string_lossy())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(GString),
    /// Element type and elements (all of that type; nested arrays allowed).
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    pub fn string(s: &str) -> Value {
        Value::String(s.into())
    }

    /// Any integer type as u64 (negative → None).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64).or(match *self {
                Value::I8(v) => Some(v as f64),
                Value::I16(v) => Some(v as f64),
                Value::I32(v) => Some(v as f64),
                Value::I64(v) => Some(v as f64),
                _ => None,
            }),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => s.as_str(),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// Short human rendering: long arrays summarized as `[type; N] first, second, ...`.
    pub fn summary(&self, max_items: usize) -> String {
        match self {
            Value::String(s) => format!("{:?}", truncate(&s.to_string_lossy(), 120)),
            Value::Array(t, v) => {
                let items: Vec<String> = v.iter().take(max_items).map(|x| x.summary(0)).collect();
                let more = if v.len() > max_items { ", ..." } else { "" };
                format!("[{}; {}] {}{}", t.name(), v.len(), items.join(", "), more)
            }
            Value::F32(x) => format!("{x}"),
            Value::F64(x) => format!("{x}"),
            Value::Bool(b) => format!("{b}"),
            Value::I8(x) => x.to_string(),
            Value::I16(x) => x.to_string(),
            Value::I32(x) => x.to_string(),
            Value::I64(x) => x.to_string(),
            other => other.as_u64().map(|u| u.to_string()).unwrap_or_default(),
        }
    }

    /// JSON rendering (arrays longer than `max_items` summarized, or full when `None`).
    pub fn to_json(&self, max_items: Option<usize>) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::String(s) => json!(s.to_string_lossy()),
            Value::Bool(b) => json!(b),
            Value::F32(x) => json!(x),
            Value::F64(x) => json!(x),
            Value::Array(t, v) => match max_items {
                Some(m) if v.len() > m => json!({
                    "type": t.name(),
                    "len": v.len(),
                    "head": v.iter().take(m).map(|x| x.to_json(Some(m))).collect::<Vec<_>>(),
                }),
                _ => json!(v.iter().map(|x| x.to_json(max_items)).collect::<Vec<_>>()),
            },
            Value::I8(x) => json!(x),
            Value::I16(x) => json!(x),
            Value::I32(x) => json!(x),
            Value::I64(x) => json!(x),
            other => json!(other.as_u64()),
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n).collect();
        format!("{t}...")
    }
}
