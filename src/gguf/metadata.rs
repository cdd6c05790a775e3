//! GGUF metadata values, and the typed lookups the model and tokenizer code use.
//!
//! Arrays are stored typed (`Vec<u32>`, `Vec<String>`, ...) rather than as a `Vec` of a value
//! enum. Besides giving `get_f32_array` a plain slice, this keeps memory proportional to the
//! file: a `u8` array of N bytes costs N bytes, where a `Vec<MetadataValue>` would cost 32N,
//! and the parser's "count × smallest element ≤ bytes left" check is what bounds allocation.
//!
//! Lookups are strict about kind but lenient about width: `get_u32` accepts any integer type
//! whose value fits, because writers disagree on widths (some store `original_context_length`
//! as u64), while a string where a number belongs is a real error and says so.

use std::collections::HashMap;

use super::error::GgufErrorKind;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: all elements share one type.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetadataArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// GGUF value type ids (`enum gguf_type`).
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The name of a value type id, for messages.
pub(crate) fn type_name(id: u32) -> &'static str {
    const NAMES: [&str; 13] = [
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
        "f64",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

impl MetadataValue {
    /// The value's type as written in messages: `u32`, `string`, `array<string>`.
    pub fn type_description(&self) -> String {
        match self {
            MetadataValue::Array(a) => format!("array<{}>", a.element_description()),
            other => type_name(other.type_id()).to_owned(),
        }
    }

    fn type_id(&self) -> u32 {
        use MetadataValue::*;
        match self {
            U8(_) => type_id::U8,
            I8(_) => type_id::I8,
            U16(_) => type_id::U16,
            I16(_) => type_id::I16,
            U32(_) => type_id::U32,
            I32(_) => type_id::I32,
            F32(_) => type_id::F32,
            Bool(_) => type_id::BOOL,
            String(_) => type_id::STRING,
            Array(_) => type_id::ARRAY,
            U64(_) => type_id::U64,
            I64(_) => type_id::I64,
            F64(_) => type_id::F64,
        }
    }

    /// The value as an `i128` if it is an integer of any width (every GGUF integer fits).
    fn as_integer(&self) -> Option<i128> {
        use MetadataValue::*;
        Some(match *self {
            U8(v) => v.into(),
            I8(v) => v.into(),
            U16(v) => v.into(),
            I16(v) => v.into(),
            U32(v) => v.into(),
            I32(v) => v.into(),
            U64(v) => v.into(),
            I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A short rendering for error messages (long strings and arrays are abbreviated).
    pub(crate) fn brief(&self) -> String {
        match self {
            MetadataValue::String(s) if s.chars().count() > 60 => {
                format!("{:?}…", s.chars().take(60).collect::<String>())
            }
            MetadataValue::String(s) => format!("{s:?}"),
            MetadataValue::Array(a) => format!("[{} × {}]", a.len(), a.element_description()),
            other => format!("{other:?}"),
        }
    }
}

impl MetadataArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        use MetadataArray::*;
        match self {
            U8(v) => v.len(),
            I8(v) => v.len(),
            U16(v) => v.len(),
            I16(v) => v.len(),
            U32(v) => v.len(),
            I32(v) => v.len(),
            F32(v) => v.len(),
            Bool(v) => v.len(),
            String(v) => v.len(),
            Array(v) => v.len(),
            U64(v) => v.len(),
            I64(v) => v.len(),
            F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn element_description(&self) -> &'static str {
        use MetadataArray::*;
        match self {
            U8(_) => "u8",
            I8(_) => "i8",
            U16(_) => "u16",
            I16(_) => "i16",
            U32(_) => "u32",
            I32(_) => "i32",
            F32(_) => "f32",
            Bool(_) => "bool",
            String(_) => "string",
            Array(_) => "array",
            U64(_) => "u64",
            I64(_) => "i64",
            F64(_) => "f64",
        }
    }
}

/// All metadata of a file, in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds an entry; a key already present is an error, since which one a reader would see
    /// is otherwise an accident of the implementation.
    pub(crate) fn insert(
        &mut self,
        key: String,
        value: MetadataValue,
    ) -> Result<(), GgufErrorKind> {
        if self.index.contains_key(&key) {
            return Err(GgufErrorKind::DuplicateKey { key });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            entries: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
        }
    }

    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `Ok(None)` if `key` is absent; an error if it is present with the wrong type.
    pub(crate) fn typed<'a, T: FromMetadata<'a>>(
        &'a self,
        key: &str,
    ) -> Result<Option<T>, GgufErrorKind> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        T::from_value(value)
            .map(Some)
            .ok_or_else(|| T::mismatch(key, value))
    }
}

/// A Rust type a metadata value can be read as.
pub(crate) trait FromMetadata<'a>: Sized {
    const EXPECTED: &'static str;
    fn from_value(value: &'a MetadataValue) -> Option<Self>;

    /// The error for a value that is present but not readable as `Self`.
    fn mismatch(key: &str, value: &MetadataValue) -> GgufErrorKind {
        GgufErrorKind::WrongType {
            key: key.to_owned(),
            expected: Self::EXPECTED,
            found: value.type_description(),
        }
    }
}

macro_rules! integer_from_metadata {
    ($($t:ty => $name:literal),*) => {$(
        impl FromMetadata<'_> for $t {
            const EXPECTED: &'static str = $name;
            fn from_value(value: &MetadataValue) -> Option<Self> {
                value.as_integer().and_then(|v| <$t>::try_from(v).ok())
            }
            /// An integer that does not fit is a bad value, not a bad type.
            fn mismatch(key: &str, value: &MetadataValue) -> GgufErrorKind {
                match value.as_integer() {
                    Some(_) => GgufErrorKind::InvalidValue {
                        key: key.to_owned(),
                        value: value.brief(),
                        expected: format!("representable as {}", $name),
                    },
                    None => GgufErrorKind::WrongType {
                        key: key.to_owned(),
                        expected: $name,
                        found: value.type_description(),
                    },
                }
            }
        }
    )*};
}
integer_from_metadata!(u32 => "u32", u64 => "u64", i32 => "i32", i64 => "i64");

impl FromMetadata<'_> for f32 {
    const EXPECTED: &'static str = "f32";
    fn from_value(value: &MetadataValue) -> Option<Self> {
        match *value {
            MetadataValue::F32(v) => Some(v),
            // Narrowing an f64 is what llama.cpp does for float hyperparameters.
            MetadataValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }
}

impl FromMetadata<'_> for bool {
    const EXPECTED: &'static str = "bool";
    fn from_value(value: &MetadataValue) -> Option<Self> {
        match *value {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> FromMetadata<'a> for &'a str {
    const EXPECTED: &'static str = "string";
    fn from_value(value: &'a MetadataValue) -> Option<Self> {
        match value {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }
}

macro_rules! slice_from_metadata {
    ($($variant:ident: $t:ty => $name:literal),*) => {$(
        impl<'a> FromMetadata<'a> for &'a [$t] {
            const EXPECTED: &'static str = $name;
            fn from_value(value: &'a MetadataValue) -> Option<Self> {
                match value {
                    MetadataValue::Array(MetadataArray::$variant(v)) => Some(v),
                    _ => None,
                }
            }
        }
    )*};
}
slice_from_metadata!(
    String: String => "array<string>",
    F32: f32 => "array<f32>",
    I32: i32 => "array<i32>",
    U32: u32 => "array<u32>",
    Bool: bool => "array<bool>"
);
