//! `from_value`: a [`Value`] into any `Deserialize` type.

use super::{Value, ValueError};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer as _, IntoDeserializer, Visitor,
};
use std::fmt;

/// Converts a [`Value`] into a Rust value with serde.
///
/// A mismatch names the Python type that was found:
///
/// ```
/// use cave_core::{from_value, Value};
/// assert_eq!(from_value::<Vec<i64>>(Value::List(vec![Value::Int(3)])).unwrap(), [3]);
/// let err = from_value::<String>(Value::Float(1.5)).unwrap_err();
/// assert!(err.to_string().contains("float"), "{err}");
/// ```
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, ValueError> {
    T::deserialize(value)
}

fn mismatch(value: &Value, expected: &str) -> ValueError {
    ValueError::new(format!(
        "expected {expected}, found a Python {}: {value}",
        value.python_type()
    ))
}

impl<'de> de::Deserializer<'de> for Value {
    type Error = ValueError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            Value::None => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Int(i) => {
                if let Ok(small) = i64::try_from(i) {
                    visitor.visit_i64(small)
                } else if let Ok(unsigned) = u64::try_from(i) {
                    visitor.visit_u64(unsigned)
                } else {
                    visitor.visit_i128(i)
                }
            }
            Value::Float(x) => visitor.visit_f64(x),
            Value::Str(s) => visitor.visit_string(s),
            Value::Bytes(b) => visitor.visit_byte_buf(b),
            Value::List(items) | Value::Tuple(items) | Value::Set(items) => {
                visitor.visit_seq(de::value::SeqDeserializer::new(items.into_iter()))
            }
            Value::Dict(entries) => {
                visitor.visit_map(de::value::MapDeserializer::new(entries.into_iter()))
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            Value::None => visitor.visit_none(),
            other => visitor.visit_some(other),
        }
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            // Python code freely produces ints where floats are declared.
            Value::Int(i) => visitor.visit_f64(i as f64),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ValueError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ValueError> {
        match self {
            Value::Str(variant) => visitor.visit_enum(variant.into_deserializer()),
            Value::Dict(mut entries) if entries.len() == 1 => {
                let (key, value) = entries.remove(0);
                visitor.visit_enum(EnumAccess { key, value })
            }
            other => Err(mismatch(
                &other,
                "an enum: a variant name or a one-entry dict",
            )),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            Value::None => visitor.visit_unit(),
            other => Err(mismatch(&other, "None")),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            Value::Bool(b) => visitor.visit_bool(b),
            other => Err(mismatch(&other, "a bool")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            Value::Str(s) => visitor.visit_string(s),
            other => Err(mismatch(&other, "a str")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            Value::List(items) | Value::Tuple(items) | Value::Set(items) => {
                visitor.visit_seq(de::value::SeqDeserializer::new(items.into_iter()))
            }
            // `bytes` reads as a sequence of ints, e.g. into a `Vec<u8>`.
            Value::Bytes(bytes) => visitor.visit_seq(de::value::SeqDeserializer::new(
                bytes.into_iter().map(|b| Value::Int(b.into())),
            )),
            other => Err(mismatch(&other, "a list, tuple or set")),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, ValueError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, ValueError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ValueError> {
        match self {
            Value::Dict(entries) => {
                visitor.visit_map(de::value::MapDeserializer::new(entries.into_iter()))
            }
            other => Err(mismatch(&other, "a dict")),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ValueError> {
        match self {
            Value::Dict(entries) => {
                visitor.visit_map(de::value::MapDeserializer::new(entries.into_iter()))
            }
            other => Err(mismatch(&other, &format!("a dict of the fields of {name}"))),
        }
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 char bytes byte_buf
        unit_struct identifier ignored_any
    }
}

impl IntoDeserializer<'_, ValueError> for Value {
    type Deserializer = Value;
    fn into_deserializer(self) -> Value {
        self
    }
}

struct EnumAccess {
    key: Value,
    value: Value,
}

impl<'de> de::EnumAccess<'de> for EnumAccess {
    type Error = ValueError;
    type Variant = Value;
    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Value), ValueError> {
        Ok((seed.deserialize(self.key)?, self.value))
    }
}

impl<'de> de::VariantAccess<'de> for Value {
    type Error = ValueError;
    fn unit_variant(self) -> Result<(), ValueError> {
        match self {
            Value::None => Ok(()),
            other => Err(mismatch(&other, "no data for a unit variant")),
        }
    }
    fn newtype_variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<S::Value, ValueError> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, ValueError> {
        self.deserialize_any(visitor)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ValueError> {
        self.deserialize_any(visitor)
    }
}

/// Any self-describing format (JSON, a `Value` itself) deserializes into a `Value`.
impl<'de> de::Deserialize<'de> for Value {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        i128::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Bytes(v.to_vec()))
    }
    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Value, E> {
        Ok(Value::Bytes(v))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        de::Deserialize::deserialize(d)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Value::Dict(entries))
    }
}
