//! Rich output: what a cell shows beyond its text (`display(obj)`, a last value with a rich
//! form, a matplotlib figure), as MIME bundles, the way Jupyter has carried them for a decade.

use crate::Value;

/// The most display items one cell sends; past it, items are counted, not sent.
pub const MAX_DISPLAY_ITEMS: usize = 256;

/// The largest form of one display item a runtime sends by default (16 MiB); larger forms are
/// left out and named in [`DisplayItem::omitted`].
pub const DEFAULT_MAX_DISPLAY: usize = 16 << 20;

/// One form of a display item: text (HTML, Markdown, SVG, JSON, LaTeX, plain text) or bytes
/// (PNG, JPEG and other images).
#[derive(Clone, PartialEq, Eq)]
pub enum DisplayData {
    /// A text form.
    Text(String),
    /// A binary form.
    Bytes(Vec<u8>),
}

impl DisplayData {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        match self {
            DisplayData::Text(text) => text.len(),
            DisplayData::Bytes(bytes) => bytes.len(),
        }
    }

    /// Returns true if and only if it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes (a text form's UTF-8).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            DisplayData::Text(text) => text.as_bytes(),
            DisplayData::Bytes(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for DisplayData {
    /// Text as text; bytes by their size (an image's bytes say nothing to a reader).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DisplayData::Text(text) => write!(f, "Text({text:?})"),
            DisplayData::Bytes(bytes) => write!(f, "Bytes({} bytes)", bytes.len()),
        }
    }
}

/// One item a cell showed: its forms by MIME type in the order the object gave them,
/// `text/plain` always among them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DisplayItem {
    /// The forms, `(MIME type, data)`.
    pub forms: Vec<(String, DisplayData)>,
    /// Forms left out for being over the runtime's size limit, `(MIME type, size in bytes)`.
    pub omitted: Vec<(String, u64)>,
}

impl DisplayItem {
    /// An item with these forms (a `text/plain` form is added, empty, when there is none).
    pub fn new(forms: impl IntoIterator<Item = (String, DisplayData)>) -> Self {
        let mut forms: Vec<(String, DisplayData)> = forms.into_iter().collect();
        if !forms.iter().any(|(mime, _)| mime == "text/plain") {
            forms.push(("text/plain".to_owned(), DisplayData::Text(String::new())));
        }
        Self {
            forms,
            omitted: Vec::new(),
        }
    }

    /// The form of `mime`, if the item has it.
    pub fn get(&self, mime: &str) -> Option<&DisplayData> {
        self.forms.iter().find(|(m, _)| m == mime).map(|(_, d)| d)
    }

    /// Its text form, what a reader without a display sees.
    pub fn text(&self) -> &str {
        match self.get("text/plain") {
            Some(DisplayData::Text(text)) => text,
            _ => "",
        }
    }

    /// Its MIME types, in order.
    pub fn mime_types(&self) -> Vec<&str> {
        self.forms.iter().map(|(m, _)| m.as_str()).collect()
    }

    /// The forms beyond text, in order.
    pub fn rich_forms(&self) -> impl Iterator<Item = (&str, &DisplayData)> {
        self.forms
            .iter()
            .filter(|(m, _)| m != "text/plain")
            .map(|(m, d)| (m.as_str(), d))
    }

    /// Its size in bytes, every form counted.
    pub fn size(&self) -> usize {
        self.forms.iter().map(|(m, d)| m.len() + d.len()).sum()
    }

    /// Decodes an item as the executor sends it: `(bundle, omitted)`, a dict of MIME type to
    /// `str` or `bytes`, and a dict of MIME type to size. What is not that is refused with
    /// what was wrong.
    pub fn from_value(value: Value) -> Result<Self, String> {
        let (bundle, omitted) = match value {
            Value::Tuple(pair) => match <[Value; 2]>::try_from(pair) {
                Ok([bundle, omitted]) => (bundle, omitted),
                Err(_) => return Err("a display item is a pair (bundle, omitted)".to_owned()),
            },
            other => {
                return Err(format!(
                    "a display item is a pair (bundle, omitted), not a {}",
                    other.python_type()
                ));
            }
        };
        let Value::Dict(bundle) = bundle else {
            return Err("a display bundle is a dict".to_owned());
        };
        let mut forms = Vec::with_capacity(bundle.len());
        for (mime, data) in bundle {
            let Value::Str(mime) = mime else {
                return Err("a display bundle's keys are MIME types (str)".to_owned());
            };
            let data = match data {
                Value::Str(text) => DisplayData::Text(text),
                Value::Bytes(bytes) => DisplayData::Bytes(bytes),
                other => {
                    return Err(format!(
                        "the {mime} form of a display item is a {}, not str or bytes",
                        other.python_type()
                    ));
                }
            };
            forms.push((mime, data));
        }
        let mut item = DisplayItem::new(forms);
        if let Value::Dict(omitted) = omitted {
            for (mime, size) in omitted {
                if let (Value::Str(mime), Value::Int(size)) = (mime, size) {
                    item.omitted.push((mime, u64::try_from(size).unwrap_or(0)));
                }
            }
        }
        Ok(item)
    }
}

/// The pixel size of a PNG or JPEG image, read from its header; `None` for other types or a
/// header that does not say.
pub fn image_size(mime: &str, bytes: &[u8]) -> Option<(u32, u32)> {
    match mime {
        "image/png" => {
            // The signature, then the IHDR chunk: length, type, width, height (big-endian).
            if bytes.len() < 24 || &bytes[..8] != b"\x89PNG\r\n\x1a\n" || &bytes[12..16] != b"IHDR"
            {
                return None;
            }
            let width = u32::from_be_bytes(bytes[16..20].try_into().ok()?);
            let height = u32::from_be_bytes(bytes[20..24].try_into().ok()?);
            Some((width, height))
        }
        "image/jpeg" => jpeg_size(bytes),
        _ => None,
    }
}

/// Walks a JPEG's segments to its start-of-frame marker (bounded by the data: each step moves
/// forward).
fn jpeg_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    let mut at = 2;
    while at + 4 <= bytes.len() {
        if bytes[at] != 0xFF {
            return None;
        }
        let marker = bytes[at + 1];
        let length = usize::from(u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]));
        let start_of_frame = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if start_of_frame {
            let frame = bytes.get(at + 4..at + 9)?;
            let height = u32::from(u16::from_be_bytes([frame[1], frame[2]]));
            let width = u32::from(u16::from_be_bytes([frame[3], frame[4]]));
            return Some((width, height));
        }
        if length < 2 {
            return None;
        }
        at += 2 + length;
    }
    None
}

/// The file extension for a MIME type's form written to a file.
pub fn file_extension(mime: &str) -> &'static str {
    match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "text/html" => "html",
        "text/markdown" => "md",
        "text/latex" => "tex",
        "application/json" => "json",
        m if m.ends_with("+json") => "json",
        _ => "txt",
    }
}

/// Writes the rich forms of item `number` under `dir` (made if needed) as
/// `display-<number>.<ext>`; each written file by MIME type, and for each form that could not
/// be written, `"<mime>: <why>"`. A name already taken (another agent writes to the same
/// directory) gets a suffix; nothing is overwritten.
pub(crate) fn write_forms(
    dir: &std::path::Path,
    number: u64,
    item: &DisplayItem,
) -> (
    std::collections::BTreeMap<String, std::path::PathBuf>,
    Vec<String>,
) {
    use std::io::Write as _;
    let mut files = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    if let Err(error) = std::fs::create_dir_all(dir) {
        for (mime, _) in item.rich_forms() {
            failures.push(format!("{mime}: cannot create {}: {error}", dir.display()));
        }
        return (files, failures);
    }
    for (mime, data) in item.rich_forms() {
        let extension = file_extension(mime);
        let written = (1..=100).find_map(|attempt| {
            let name = match attempt {
                1 => format!("display-{number}.{extension}"),
                n => format!("display-{number}-{n}.{extension}"),
            };
            let path = dir.join(name);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => Some(file.write_all(data.as_bytes()).map(|()| path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                Err(e) => Some(Err(e)),
            }
        });
        match written {
            Some(Ok(path)) => {
                files.insert(mime.to_owned(), path);
            }
            Some(Err(error)) => failures.push(format!("{mime}: {error}")),
            None => failures.push(format!("{mime}: no free file name in {}", dir.display())),
        }
    }
    (files, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_decodes_from_what_the_executor_sends() {
        let value = Value::Tuple(vec![
            Value::Dict(vec![
                ("text/html".into(), "<b>hi</b>".into()),
                ("image/png".into(), Value::Bytes(vec![1, 2, 3])),
                ("text/plain".into(), "H()".into()),
            ]),
            Value::Dict(vec![("image/jpeg".into(), Value::Int(99))]),
        ]);
        let item = DisplayItem::from_value(value).unwrap();
        assert_eq!(item.mime_types(), ["text/html", "image/png", "text/plain"]);
        assert_eq!(item.text(), "H()");
        assert_eq!(item.omitted, [("image/jpeg".to_owned(), 99)]);
        assert_eq!(
            format!("{:?}", item.get("image/png").unwrap()),
            "Bytes(3 bytes)"
        );
        for bad in [
            Value::Int(1),
            Value::Tuple(vec![Value::Int(1), Value::Dict(Vec::new())]),
            Value::Tuple(vec![
                Value::Dict(vec![("text/plain".into(), Value::Int(1))]),
                Value::Dict(Vec::new()),
            ]),
        ] {
            assert!(DisplayItem::from_value(bad).is_err());
        }
        // No text form: an empty one is added, so every item has one.
        let bare = DisplayItem::new([("image/png".to_owned(), DisplayData::Bytes(vec![]))]);
        assert_eq!(bare.text(), "");
    }

    #[test]
    fn rich_forms_are_written_once_each_and_never_over_a_file() {
        let dir = std::env::temp_dir().join(format!("cave-display-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let item = DisplayItem::new([
            ("text/html".to_owned(), DisplayData::Text("<b>x</b>".into())),
            ("image/png".to_owned(), DisplayData::Bytes(vec![1, 2, 3])),
            ("text/plain".to_owned(), DisplayData::Text("x".into())),
        ]);
        let (files, failures) = write_forms(&dir, 3, &item);
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(files["image/png"], dir.join("display-3.png"));
        assert_eq!(std::fs::read(&files["image/png"]).unwrap(), [1, 2, 3]);
        assert_eq!(
            std::fs::read_to_string(&files["text/html"]).unwrap(),
            "<b>x</b>"
        );
        assert!(
            !files.contains_key("text/plain"),
            "the text form is in the event"
        );
        // The same number again (another agent on the same directory): new names.
        let (again, _) = write_forms(&dir, 3, &item);
        assert_eq!(again["image/png"], dir.join("display-3-2.png"));
        assert_eq!(std::fs::read(dir.join("display-3.png")).unwrap(), [1, 2, 3]);
        // A directory that cannot be made: each form says why.
        let blocked = dir.join("display-3.png").join("sub");
        let (none, failures) = write_forms(&blocked, 4, &item);
        assert!(none.is_empty() && failures.len() == 2, "{failures:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn image_sizes_come_from_the_headers() {
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend(640u32.to_be_bytes());
        png.extend(480u32.to_be_bytes());
        assert_eq!(image_size("image/png", &png), Some((640, 480)));
        assert_eq!(image_size("image/png", &png[..20]), None);
        // SOI, an APP0 segment of 16 bytes, then SOF0 with height 200 and width 300.
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
        jpeg.extend([0; 14]);
        jpeg.extend([0xFF, 0xC0, 0x00, 0x11, 0x08, 0x00, 0xC8, 0x01, 0x2C]);
        assert_eq!(image_size("image/jpeg", &jpeg), Some((300, 200)));
        assert_eq!(
            image_size("image/jpeg", &[0xFF, 0xD8, 0xFF, 0xE0, 0, 0]),
            None
        );
        assert_eq!(image_size("image/gif", &png), None);
    }
}
