//! `to_value`: any `Serialize` type into a [`Value`].

use super::{Value, ValueError};
use serde::ser::{self, Serialize};

/// Converts a Rust value into a [`Value`] with serde.
///
/// ```
/// use cave_core::{to_value, Value};
/// assert_eq!(to_value(&(1, "a")).unwrap(), Value::Tuple(vec![Value::Int(1), "a".into()]));
/// ```
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, ValueError> {
    value.serialize(Serializer)
}

struct Serializer;

/// Collects a sequence, tuple or dict.
pub(super) struct Collect {
    kind: CollectKind,
    items: Vec<Value>,
    entries: Vec<(Value, Value)>,
    pending_key: Option<Value>,
    variant: Option<&'static str>,
}

enum CollectKind {
    List,
    Tuple,
    Dict,
}

impl Collect {
    fn new(kind: CollectKind, variant: Option<&'static str>) -> Self {
        Self {
            kind,
            items: Vec::new(),
            entries: Vec::new(),
            pending_key: None,
            variant,
        }
    }
    fn finish(self) -> Value {
        let value = match self.kind {
            CollectKind::List => Value::List(self.items),
            CollectKind::Tuple => Value::Tuple(self.items),
            CollectKind::Dict => Value::Dict(self.entries),
        };
        match self.variant {
            Some(name) => Value::Dict(vec![(Value::Str(name.to_owned()), value)]),
            None => value,
        }
    }
}

impl ser::Serializer for Serializer {
    type Ok = Value;
    type Error = ValueError;
    type SerializeSeq = Collect;
    type SerializeTuple = Collect;
    type SerializeTupleStruct = Collect;
    type SerializeTupleVariant = Collect;
    type SerializeMap = Collect;
    type SerializeStruct = Collect;
    type SerializeStructVariant = Collect;

    fn serialize_bool(self, v: bool) -> Result<Value, ValueError> {
        Ok(Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_i128(self, v: i128) -> Result<Value, ValueError> {
        Ok(Value::Int(v))
    }
    fn serialize_u8(self, v: u8) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Value, ValueError> {
        Ok(Value::Int(v.into()))
    }
    fn serialize_u128(self, v: u128) -> Result<Value, ValueError> {
        i128::try_from(v).map(Value::Int).map_err(|_| {
            ValueError::new(format!(
                "the integer {v} does not fit a runtime int (±2^127)"
            ))
        })
    }
    fn serialize_f32(self, v: f32) -> Result<Value, ValueError> {
        Ok(Value::Float(v.into()))
    }
    fn serialize_f64(self, v: f64) -> Result<Value, ValueError> {
        Ok(Value::Float(v))
    }
    fn serialize_char(self, v: char) -> Result<Value, ValueError> {
        Ok(Value::Str(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Value, ValueError> {
        Ok(Value::Str(v.to_owned()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Value, ValueError> {
        Ok(Value::Bytes(v.to_vec()))
    }
    fn serialize_none(self) -> Result<Value, ValueError> {
        Ok(Value::None)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Value, ValueError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Value, ValueError> {
        Ok(Value::None)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<Value, ValueError> {
        Ok(Value::None)
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Value, ValueError> {
        Ok(Value::Str(variant.to_owned()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Value, ValueError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Value, ValueError> {
        Ok(Value::Dict(vec![(
            Value::Str(variant.to_owned()),
            to_value(value)?,
        )]))
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Collect, ValueError> {
        Ok(Collect::new(CollectKind::List, None))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Collect, ValueError> {
        Ok(Collect::new(CollectKind::Tuple, None))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Collect, ValueError> {
        Ok(Collect::new(CollectKind::Tuple, None))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Collect, ValueError> {
        Ok(Collect::new(CollectKind::Tuple, Some(variant)))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Collect, ValueError> {
        Ok(Collect::new(CollectKind::Dict, None))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Collect, ValueError> {
        Ok(Collect::new(CollectKind::Dict, None))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Collect, ValueError> {
        Ok(Collect::new(CollectKind::Dict, Some(variant)))
    }
}

macro_rules! collect_elements {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Collect {
            type Ok = Value;
            type Error = ValueError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
                self.items.push(to_value(value)?);
                Ok(())
            }
            fn end(self) -> Result<Value, ValueError> {
                Ok(self.finish())
            }
        }
    )*};
}
collect_elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Collect {
    type Ok = Value;
    type Error = ValueError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), ValueError> {
        self.pending_key = Some(to_value(key)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
        let key = self
            .pending_key
            .take()
            .ok_or_else(|| ValueError::new("a map value was serialized before its key"))?;
        self.entries.push((key, to_value(value)?));
        Ok(())
    }
    fn end(self) -> Result<Value, ValueError> {
        Ok(self.finish())
    }
}

macro_rules! collect_fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Collect {
            type Ok = Value;
            type Error = ValueError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), ValueError> {
                self.entries.push((Value::Str(key.to_owned()), to_value(value)?));
                Ok(())
            }
            fn end(self) -> Result<Value, ValueError> {
                Ok(self.finish())
            }
        }
    )*};
}
collect_fields!(SerializeStruct, SerializeStructVariant);

/// `Value` serializes as the matching serde shape (tuples as tuples, sets and lists as
/// sequences, dicts as maps), so it round-trips through `to_value`.
impl Serialize for Value {
    fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use ser::{SerializeMap, SerializeSeq, SerializeTuple};
        match self {
            Value::None => s.serialize_none(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => match i64::try_from(*i) {
                Ok(small) => s.serialize_i64(small),
                Err(_) => s.serialize_i128(*i),
            },
            Value::Float(x) => s.serialize_f64(*x),
            Value::Str(v) => s.serialize_str(v),
            Value::Bytes(b) => s.serialize_bytes(b),
            Value::List(items) | Value::Set(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Tuple(items) => {
                let mut tuple = s.serialize_tuple(items.len())?;
                for item in items {
                    tuple.serialize_element(item)?;
                }
                tuple.end()
            }
            Value::Dict(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}
