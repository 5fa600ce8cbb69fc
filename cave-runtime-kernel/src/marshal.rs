//! The kernel protocol's encoding: Python's `marshal` format, version 2, for data only.
//!
//! The child writes frames with `marshal.dumps(message, 2)` (C speed both ways), and loads
//! only what the host wrote. The host reads with this strict decoder: data types only (no code
//! objects, no references, nothing that runs), bounded depth and sizes, so a hostile child can
//! make it fail but not crash, hang or allocate beyond the frame it sent.

use cave_core::Value;

/// How deep a value may nest (the in-process runtime's bound), plus room for the envelope.
pub(crate) const MAX_VALUE_DEPTH: usize = 512;
const ENVELOPE_DEPTH: usize = 4;

/// A frame that is not the data the protocol allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    /// The bytes end in the middle of a value.
    #[error("the frame ends in the middle of a value")]
    Truncated,
    /// A type code the protocol does not carry.
    #[error("type code {0:#04x} is not data the protocol carries")]
    UnknownType(u8),
    /// Deeper than the runtime converts.
    #[error("structure nested deeper than {MAX_VALUE_DEPTH} levels")]
    TooDeep,
    /// An integer beyond `Value::Int`.
    #[error("int larger than 128 bits")]
    IntTooLarge,
    /// Bytes after the value.
    #[error("{0} bytes follow the value")]
    Trailing(usize),
    /// A negative or impossible length.
    #[error("a length of {0} is impossible here")]
    BadLength(i64),
}

/// A value the child could not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EncodeError {
    /// Deeper than the runtime converts.
    #[error(
        "the value is nested deeper than {MAX_VALUE_DEPTH} levels, which the runtime does not convert"
    )]
    TooDeep,
    /// A dict key or set element Python cannot hash.
    #[error(
        "a dict key or set element is a {0}, which Python cannot hash: use None, bool, int, float, str, bytes or a tuple of them"
    )]
    Unhashable(&'static str),
}

/// A message to encode: owned parts beside values borrowed from where they live (a
/// registered variable is encoded without being copied first).
#[derive(Debug)]
pub(crate) enum Data<'a> {
    /// A value owned by the message.
    Owned(Value),
    /// A value borrowed from elsewhere.
    Borrowed(&'a Value),
    /// A tuple of parts.
    Tuple(Vec<Data<'a>>),
    /// A list of parts.
    List(Vec<Data<'a>>),
}

impl From<Value> for Data<'_> {
    fn from(value: Value) -> Self {
        Data::Owned(value)
    }
}

impl From<&str> for Data<'_> {
    fn from(text: &str) -> Self {
        Data::Owned(Value::Str(text.to_owned()))
    }
}

/// Appends `data` in marshal format.
pub(crate) fn encode(data: &Data<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match data {
        Data::Owned(value) => encode_at(value, out, 0, false),
        Data::Borrowed(value) => encode_at(value, out, 0, false),
        Data::Tuple(parts) | Data::List(parts) => {
            encode_len(
                out,
                if matches!(data, Data::Tuple(_)) {
                    b'('
                } else {
                    b'['
                },
                parts.len(),
            );
            parts.iter().try_for_each(|part| encode(part, out))
        }
    }
}

/// Checks that the child can load `value` (depth, hashable keys) without encoding it.
pub(crate) fn check(value: &Value) -> Result<(), EncodeError> {
    check_at(value, 0, false)
}

fn check_at(value: &Value, depth: usize, hashed: bool) -> Result<(), EncodeError> {
    if depth > MAX_VALUE_DEPTH + ENVELOPE_DEPTH {
        return Err(EncodeError::TooDeep);
    }
    match value {
        Value::List(_) | Value::Dict(_) | Value::Set(_) if hashed => {
            Err(EncodeError::Unhashable(value.python_type()))
        }
        Value::List(items) => items.iter().try_for_each(|v| check_at(v, depth + 1, false)),
        Value::Tuple(items) => items
            .iter()
            .try_for_each(|v| check_at(v, depth + 1, hashed)),
        Value::Set(items) => items.iter().try_for_each(|v| check_at(v, depth + 1, true)),
        Value::Dict(entries) => entries.iter().try_for_each(|(k, v)| {
            check_at(k, depth + 1, true)?;
            check_at(v, depth + 1, false)
        }),
        _ => Ok(()),
    }
}

fn encode_len(out: &mut Vec<u8>, code: u8, len: usize) {
    out.push(code);
    // Python cannot hold a container of 2^31 items here; the frame limit stops such values
    // long before, so saturating only guards the arithmetic.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

/// `hashed`: the value is (inside) a dict key or set element, so it must be hashable.
fn encode_at(
    value: &Value,
    out: &mut Vec<u8>,
    depth: usize,
    hashed: bool,
) -> Result<(), EncodeError> {
    if depth > MAX_VALUE_DEPTH + ENVELOPE_DEPTH {
        return Err(EncodeError::TooDeep);
    }
    match value {
        Value::None => out.push(b'N'),
        Value::Bool(true) => out.push(b'T'),
        Value::Bool(false) => out.push(b'F'),
        Value::Int(i) => encode_int(*i, out),
        Value::Float(x) => {
            out.push(b'g');
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Str(s) => {
            encode_len(out, b'u', s.len());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bytes(b) => {
            encode_len(out, b's', b.len());
            out.extend_from_slice(b);
        }
        Value::List(_) | Value::Dict(_) | Value::Set(_) if hashed => {
            return Err(EncodeError::Unhashable(value.python_type()));
        }
        Value::List(items) | Value::Tuple(items) | Value::Set(items) => {
            let (code, inner) = match value {
                Value::List(_) => (b'[', false),
                Value::Tuple(_) => (b'(', hashed),
                _ => (b'<', true),
            };
            encode_len(out, code, items.len());
            for item in items {
                encode_at(item, out, depth + 1, inner)?;
            }
        }
        Value::Dict(entries) => {
            out.push(b'{');
            for (k, v) in entries {
                encode_at(k, out, depth + 1, true)?;
                encode_at(v, out, depth + 1, false)?;
            }
            out.push(b'0');
        }
        // `Value` is non-exhaustive; a future kind must be given an encoding here.
        #[allow(unreachable_patterns)]
        _ => out.push(b'N'),
    }
    Ok(())
}

fn encode_int(i: i128, out: &mut Vec<u8>) {
    if let Ok(small) = i32::try_from(i) {
        out.push(b'i');
        out.extend_from_slice(&small.to_le_bytes());
        return;
    }
    // Python's long: 15-bit digits, least significant first, the sign on the digit count.
    let mut magnitude = i.unsigned_abs();
    let mut digits = Vec::with_capacity(9);
    while magnitude > 0 {
        digits.push((magnitude & 0x7fff) as u16);
        magnitude >>= 15;
    }
    let count = digits.len() as i32;
    out.push(b'l');
    out.extend_from_slice(&(if i < 0 { -count } else { count }).to_le_bytes());
    for d in digits {
        out.extend_from_slice(&d.to_le_bytes());
    }
}

/// Reads one value that fills `bytes` exactly. An integer beyond 128 bits does not fail the
/// frame: it reads as `None` and the second element names it, so that the message it is in can
/// be refused on its own.
pub(crate) fn decode(bytes: &[u8]) -> Result<(Value, Option<String>), DecodeError> {
    let mut reader = Reader {
        bytes,
        at: 0,
        unsupported: None,
    };
    let value = reader.value(0)?;
    match bytes.len() - reader.at {
        0 => Ok((value, reader.unsupported)),
        rest => Err(DecodeError::Trailing(rest)),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    unsupported: Option<String>,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(DecodeError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        let b = self.take(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A length whose items need at least `min_item` bytes each: never more than is left.
    fn len(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.i32()?;
        let n = usize::try_from(n).map_err(|_| DecodeError::BadLength(n.into()))?;
        let left = self.bytes.len() - self.at;
        if n.saturating_mul(min_item) > left {
            return Err(DecodeError::BadLength(n as i64));
        }
        Ok(n)
    }

    fn items(&mut self, depth: usize) -> Result<Vec<Value>, DecodeError> {
        let n = self.len(1)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(items)
    }

    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        if depth > MAX_VALUE_DEPTH + ENVELOPE_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let code = self.take(1)?[0];
        Ok(match code {
            b'N' => Value::None,
            b'T' => Value::Bool(true),
            b'F' => Value::Bool(false),
            b'i' => Value::Int(self.i32()?.into()),
            b'l' => match self.long() {
                Err(DecodeError::IntTooLarge) => {
                    self.unsupported
                        .get_or_insert_with(|| DecodeError::IntTooLarge.to_string());
                    Value::None
                }
                other => other?,
            },
            b'g' => {
                let b = self.take(8)?;
                let mut raw = [0u8; 8];
                raw.copy_from_slice(b);
                Value::Float(f64::from_le_bytes(raw))
            }
            b'u' | b't' => {
                let n = self.len(1)?;
                Value::Str(python_text(self.take(n)?))
            }
            b's' => {
                let n = self.len(1)?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            b'[' => Value::List(self.items(depth)?),
            b'(' => Value::Tuple(self.items(depth)?),
            b'<' | b'>' => Value::Set(self.items(depth)?),
            b'{' => {
                let mut entries = Vec::new();
                loop {
                    if self.bytes.get(self.at) == Some(&b'0') {
                        self.at += 1;
                        break;
                    }
                    let key = self.value(depth + 1)?;
                    let value = self.value(depth + 1)?;
                    entries.push((key, value));
                }
                Value::Dict(entries)
            }
            other => return Err(DecodeError::UnknownType(other)),
        })
    }

    fn long(&mut self) -> Result<Value, DecodeError> {
        let n = self.i32()?;
        let count = n.unsigned_abs() as usize;
        if count > 9 {
            // 9 digits of 15 bits hold 135 bits: more cannot be an i128.
            self.take(count.saturating_mul(2))?;
            return Err(DecodeError::IntTooLarge);
        }
        let raw = self.take(count * 2)?;
        let mut magnitude: u128 = 0;
        for (k, pair) in raw.chunks_exact(2).enumerate() {
            let digit = u128::from(u16::from_le_bytes([pair[0], pair[1]]) & 0x7fff);
            magnitude |= digit << (15 * k);
            if k == 8 && digit >> 8 != 0 {
                return Err(DecodeError::IntTooLarge);
            }
        }
        let value = if n < 0 {
            if magnitude > i128::MIN.unsigned_abs() {
                return Err(DecodeError::IntTooLarge);
            }
            0i128.wrapping_sub_unsigned(magnitude)
        } else {
            i128::try_from(magnitude).map_err(|_| DecodeError::IntTooLarge)?
        };
        Ok(Value::Int(value))
    }
}

/// Python text as marshal writes it (UTF-8 with lone surrogates passed through): each lone
/// surrogate becomes one U+FFFD, as in the in-process runtime.
pub(crate) fn python_text(bytes: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                out.push_str(text);
                break;
            }
            Err(error) => {
                let (valid, after) = rest.split_at(error.valid_up_to());
                // SAFETY-free: `valid_up_to` marks a prefix that is valid UTF-8.
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                out.push('\u{FFFD}');
                let skip = match after {
                    [0xED, 0xA0..=0xBF, 0x80..=0xBF, ..] => 3,
                    _ => error.error_len().unwrap_or(after.len()).max(1),
                };
                rest = &after[skip.min(after.len())..];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(value: Value) {
        let mut bytes = Vec::new();
        encode(&Data::Borrowed(&value), &mut bytes).unwrap();
        let (back, unsupported) = decode(&bytes).unwrap();
        assert_eq!(unsupported, None);
        match (&value, &back) {
            (Value::Float(a), Value::Float(b)) if a.is_nan() => assert!(b.is_nan()),
            _ => assert_eq!(back, value),
        }
    }

    #[test]
    fn values_round_trip() {
        for value in [
            Value::None,
            Value::Bool(true),
            Value::Int(0),
            Value::Int(i32::MIN.into()),
            Value::Int(i32::MAX as i128 + 1),
            Value::Int(i128::MAX),
            Value::Int(i128::MIN),
            Value::Int(-(1 << 100)),
            Value::Float(f64::NAN),
            Value::Float(-0.5),
            Value::Str("héllo ✓".into()),
            Value::Bytes(vec![0, 255]),
            Value::Tuple(vec![Value::Int(1), Value::List(vec![])]),
            Value::Set(vec![Value::Str("a".into())]),
            Value::Dict(vec![(Value::Tuple(vec![Value::Int(1)]), Value::None)]),
        ] {
            round_trip(value);
        }
    }

    #[test]
    fn hostile_frames_fail_cleanly() {
        // A list claiming 2^31 - 1 items in a 5-byte frame.
        assert!(matches!(
            decode(b"[\xff\xff\xff\x7f"),
            Err(DecodeError::BadLength(_))
        ));
        assert_eq!(
            decode(b"c").map(|(v, _)| v),
            Err(DecodeError::UnknownType(b'c'))
        );
        assert_eq!(decode(b"NN").map(|(v, _)| v), Err(DecodeError::Trailing(1)));
        assert_eq!(decode(b"{N").map(|(v, _)| v), Err(DecodeError::Truncated));
        let deep = "[\x01\x00\x00\x00".repeat(100_000) + "N";
        assert_eq!(
            decode(deep.as_bytes()).map(|(v, _)| v),
            Err(DecodeError::TooDeep)
        );
        // 2^135: ten digits.
        let mut huge = b"l\x0a\x00\x00\x00".to_vec();
        huge.extend(std::iter::repeat_n(0u8, 18));
        huge.extend([1, 0]);
        assert_eq!(
            decode(&huge),
            Ok((Value::None, Some("int larger than 128 bits".to_owned())))
        );
        let mut deep_value = Value::None;
        for _ in 0..600 {
            deep_value = Value::List(vec![deep_value]);
        }
        assert_eq!(
            encode(&Data::Borrowed(&deep_value), &mut Vec::new()),
            Err(EncodeError::TooDeep)
        );
        assert_eq!(check(&deep_value), Err(EncodeError::TooDeep));
        let unhashable = Value::Dict(vec![(Value::Tuple(vec![Value::List(vec![])]), Value::None)]);
        assert_eq!(check(&unhashable), Err(EncodeError::Unhashable("list")));
        assert_eq!(
            encode(&Data::Borrowed(&unhashable), &mut Vec::new()),
            Err(EncodeError::Unhashable("list"))
        );
        assert_eq!(
            check(&Value::Set(vec![Value::Tuple(vec![Value::Int(1)])])),
            Ok(())
        );
    }

    /// Streams of frames a child could send, cut by the host's codec and decoded: each ends in
    /// a value or an error (`cargo xtask fuzz` runs a million cases; the suite a short form).
    #[test]
    fn fuzz_frames_from_the_child() {
        use tokio_util::bytes::BytesMut;
        use tokio_util::codec::{Decoder, LengthDelimitedCodec};
        let values = [
            Value::Tuple(vec!["out".into(), Value::Int(3), "line\n".into()]),
            Value::Tuple(vec![
                "done".into(),
                Value::Int(3),
                Value::Tuple(vec!["ValueError".into(), "bad".into()]),
            ]),
            Value::Tuple(vec![
                "call".into(),
                Value::Int(9),
                Value::Int(1),
                "method".into(),
                Value::List(vec![Value::Tuple(vec!["x".into(), Value::Float(1.5)])]),
            ]),
            Value::Tuple(vec![
                "reply".into(),
                Value::Int(4),
                "ok".into(),
                Value::Dict(vec![
                    ("é✓".into(), Value::Bytes(vec![0, 255])),
                    (Value::Int(-(1 << 100)), Value::Set(vec![Value::Bool(true)])),
                ]),
            ]),
            Value::List(vec![Value::List(vec![Value::List(vec![Value::None])])]),
        ];
        let mut seeds = Vec::new();
        for value in &values {
            let mut frame = Vec::new();
            encode(&Data::Borrowed(value), &mut frame).unwrap();
            seeds.push(frame.clone());
            let mut framed = (frame.len() as u32).to_be_bytes().to_vec();
            framed.extend_from_slice(&frame);
            seeds.push(framed.repeat(2));
        }
        cave_testing::fuzz::soak("kernel-frames", &seeds, |input| {
            let _ = decode(input);
            let _ = python_text(input);
            let mut codec = LengthDelimitedCodec::builder()
                .max_frame_length(1 << 20)
                .new_codec();
            let mut buffer = BytesMut::from(input);
            while let Ok(Some(frame)) = codec.decode(&mut buffer) {
                if let Ok((value, _)) = decode(&frame) {
                    // What decodes is data the host can hold and send back.
                    let _ = encode(&Data::Borrowed(&value), &mut Vec::new());
                }
            }
        });
    }

    #[test]
    fn lone_surrogates_become_one_replacement_each() {
        assert_eq!(python_text(b"a\xed\xa0\x80b"), "a\u{FFFD}b");
        assert_eq!(python_text(b"\xff"), "\u{FFFD}");
    }
}
