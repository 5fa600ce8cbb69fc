//! Secrets kept out of what the model reads and what events and logs show: every occurrence of
//! a secret's value, and of the forms code most often prints it in (Python's `repr`, JSON,
//! base64, hex), becomes `[redacted: NAME]`.
//!
//! This stops accidental disclosure (a traceback, a debug print, a config dump). Code written
//! to leak a secret (one character per line, reversed, encrypted) is not recognised: keep
//! secrets out of runtimes whose code you do not trust, or give it functions that use them
//! instead.

/// The shortest secret that can be told apart from ordinary output.
pub const MIN_SECRET_CHARS: usize = 4;

/// Replaces secrets in text: the one redactor of the crates (secret variables in what the model
/// and the events see, API keys in provider errors and in what `cave` prints).
#[derive(Clone, Default)]
pub struct SecretRedactor {
    /// `(form, marker)`, longest form first.
    forms: Vec<(String, String)>,
    /// Characters in the longest form.
    longest: usize,
    /// Whether anything shaped like an API key (`sk-…`) is masked too.
    key_shapes: bool,
}

impl std::fmt::Debug for SecretRedactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The forms are the secrets: never shown.
        f.debug_struct("SecretRedactor")
            .field("forms", &self.forms.len())
            .finish()
    }
}

impl SecretRedactor {
    /// A redactor for these `(name, value)` pairs (values shorter than
    /// [`MIN_SECRET_CHARS`] are ignored: registration refuses them).
    pub fn new(secrets: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut forms: Vec<(String, String)> = Vec::new();
        for (name, value) in secrets {
            if value.chars().count() < MIN_SECRET_CHARS {
                continue;
            }
            let marker = format!("[redacted: {name}]");
            for form in forms_of(&value) {
                if form.chars().count() >= MIN_SECRET_CHARS
                    && !forms.iter().any(|(f, _)| *f == form)
                {
                    forms.push((form, marker.clone()));
                }
            }
        }
        forms.sort_by_key(|(form, _)| std::cmp::Reverse(form.len()));
        let longest = forms
            .iter()
            .map(|(f, _)| f.chars().count())
            .max()
            .unwrap_or(0);
        Self {
            forms,
            longest,
            key_shapes: false,
        }
    }

    /// The redactor for an API key: its forms become `[redacted: API key]`, and anything
    /// shaped like a key is masked too ([`with_key_shapes`](Self::with_key_shapes)).
    pub fn for_api_key(key: Option<&str>) -> Self {
        Self::new(key.map(|k| ("API key".to_owned(), k.to_owned()))).with_key_shapes()
    }

    /// Also masks anything shaped like an API key (`sk-…` becomes `sk-[redacted]`), whatever
    /// its value: providers echo keys back, sometimes partly masked (`sk-proj-****abcd`), and
    /// a key of another account is a secret too. Applies to [`redact`](Self::redact).
    pub fn with_key_shapes(mut self) -> Self {
        self.key_shapes = true;
        self
    }

    /// Returns true if and only if there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.forms.is_empty() && !self.key_shapes
    }

    /// `text` with every form of every secret replaced by its marker.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (form, marker) in &self.forms {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), marker);
            }
        }
        if self.key_shapes {
            out = mask_key_shapes(&out);
        }
        out
    }

    /// A redaction of text that arrives in pieces: what [`StreamRedaction::push`] returns is
    /// safe to show, the rest waits until it cannot be the start of a secret.
    pub fn stream(&self) -> StreamRedaction<'_> {
        StreamRedaction {
            redactor: self,
            pending: String::new(),
        }
    }
}

/// Redaction of streamed text (see [`SecretRedactor::stream`]).
#[derive(Debug)]
pub struct StreamRedaction<'a> {
    redactor: &'a SecretRedactor,
    pending: String,
}

impl StreamRedaction<'_> {
    /// Adds a piece; returns what can be shown now, redacted.
    pub fn push(&mut self, chunk: &str) -> String {
        if self.redactor.is_empty() {
            return chunk.to_owned();
        }
        self.pending.push_str(chunk);
        // Keep back what could still be the start of a secret: fewer characters than the
        // longest form, moved back to the start of any form the cut would split.
        let keep = self.redactor.longest.saturating_sub(1);
        let chars = self.pending.chars().count();
        if chars <= keep {
            return String::new();
        }
        let mut cut = self
            .pending
            .char_indices()
            .nth(chars - keep)
            .map_or(self.pending.len(), |(i, _)| i);
        // Moving the cut back can make another form straddle it: repeat until none does
        // (the cut only moves back, so this ends).
        loop {
            let before = cut;
            for (form, _) in &self.redactor.forms {
                let mut from = 0;
                while let Some(at) = self.pending[from..].find(form.as_str()) {
                    let start = from + at;
                    if start < cut && start + form.len() > cut {
                        cut = start;
                    }
                    from = start + 1;
                    while !self.pending.is_char_boundary(from) {
                        from += 1;
                    }
                    if from >= self.pending.len() {
                        break;
                    }
                }
            }
            if cut == before {
                break;
            }
        }
        let rest = self.pending.split_off(cut);
        let ready = std::mem::replace(&mut self.pending, rest);
        self.redactor.redact(&ready)
    }

    /// The rest, redacted, once nothing more comes.
    pub fn finish(self) -> String {
        self.redactor.redact(&self.pending)
    }
}

/// The fewest characters after `sk-` that make a key shape (real keys have dozens; a partly
/// masked echo such as `sk-proj-****abcd` has 13).
const KEY_SHAPE_CHARS: usize = 8;

/// Each `sk-` that starts a word and is followed by at least [`KEY_SHAPE_CHARS`] characters a
/// key holds, masked with those characters; anything else (`task-list`, `risk-free`, `sk-1`)
/// is left as it is.
fn mask_key_shapes(text: &str) -> String {
    let holds = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '*' | '.');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sk-") {
        let before = rest[..at].chars().next_back().or(out.chars().next_back());
        let starts_word = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
        let tail = &rest[at + 3..];
        let end = tail.find(|c: char| !holds(c)).unwrap_or(tail.len());
        out.push_str(&rest[..at]);
        if starts_word && end >= KEY_SHAPE_CHARS {
            out.push_str("sk-[redacted]");
            rest = &tail[end..];
        } else {
            out.push_str("sk-");
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// The value, and how code commonly prints it.
fn forms_of(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_owned(), python_repr_body(value)];
    if let Ok(json) = serde_json::to_string(value) {
        forms.push(json[1..json.len() - 1].to_owned());
    }
    let bytes = value.as_bytes();
    let standard = base64(bytes, STANDARD);
    forms.push(standard.trim_end_matches('=').to_owned());
    forms.push(standard);
    let url = base64(bytes, URL_SAFE);
    forms.push(url.trim_end_matches('=').to_owned());
    forms.push(url);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    forms.push(hex.to_uppercase());
    forms.push(hex);
    forms
}

/// What Python's `repr` of the string puts between the quotes.
fn python_repr_body(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\'' if value.contains('"') => out.push_str("\\'"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64(bytes: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(alphabet[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of any account are masked, and only keys: words that merely contain `sk-` stay.
    #[test]
    fn key_shapes_are_masked_and_words_are_not() {
        let redactor = SecretRedactor::for_api_key(Some("sk-own-0123456789"));
        assert_eq!(
            redactor.redact("mine sk-own-0123456789, theirs sk-proj-****abcd; (sk-ant-api03-XyZ)"),
            "mine [redacted: API key], theirs sk-[redacted]; (sk-[redacted])"
        );
        for text in [
            "the task-list",
            "risk-free",
            "ask-me-anything",
            "sk-1",
            "desk-top sk-",
        ] {
            assert_eq!(redactor.redact(text), text);
        }
        assert!(SecretRedactor::for_api_key(None).redact("risk-free") == "risk-free");
    }

    fn redactor() -> SecretRedactor {
        SecretRedactor::new([("TOKEN".to_owned(), "s3cr3t-ab'c\\d".to_owned())])
    }

    #[test]
    fn every_form_is_redacted() {
        let r = redactor();
        let value = "s3cr3t-ab'c\\d";
        for text in [
            value.to_owned(),
            "s3cr3t-ab\\'c\\\\d".to_owned().replace("\\'", "'"),
            "czNjcjN0LWFiJ2NcZA==".to_owned(),
            "czNjcjN0LWFiJ2NcZA".to_owned(),
            value
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            value
                .bytes()
                .map(|b| format!("{b:02X}"))
                .collect::<String>(),
        ] {
            assert_eq!(
                r.redact(&format!("before {text} after")),
                "before [redacted: TOKEN] after",
                "{text}"
            );
        }
        assert_eq!(base64(b"ab", STANDARD), "YWI=");
        assert_eq!(base64(b"abc", STANDARD), "YWJj");
        assert_eq!(r.redact("nothing here"), "nothing here");
        assert!(!format!("{r:?}").contains("s3cr3t"));
    }

    #[test]
    fn a_secret_split_across_pieces_is_still_redacted() {
        let r = SecretRedactor::new([("KEY".to_owned(), "hunter2-xyz".to_owned())]);
        let text = "log: hunter2-xyz done, again hunter2-xyz.\n";
        for size in 1..text.len() {
            let mut stream = r.stream();
            let mut shown = String::new();
            let mut rest = text;
            while !rest.is_empty() {
                let at = rest.char_indices().nth(size).map_or(rest.len(), |(i, _)| i);
                shown.push_str(&stream.push(&rest[..at]));
                rest = &rest[at..];
            }
            shown.push_str(&stream.finish());
            assert_eq!(
                shown, "log: [redacted: KEY] done, again [redacted: KEY].\n",
                "pieces of {size}"
            );
        }
        // Two secrets, one inside the other's neighbourhood: both redacted at every split.
        let two = SecretRedactor::new([
            ("A".to_owned(), "abcdefgh".to_owned()),
            ("B".to_owned(), "ghijklmnop".to_owned()),
        ]);
        for size in 1..12 {
            let text = "xxabcdefgh yy ghijklmnop zz";
            let mut stream = two.stream();
            let mut shown = String::new();
            for piece in text.as_bytes().chunks(size) {
                shown.push_str(&stream.push(std::str::from_utf8(piece).unwrap()));
            }
            shown.push_str(&stream.finish());
            assert_eq!(
                shown, "xx[redacted: A] yy [redacted: B] zz",
                "pieces of {size}"
            );
        }
        // Nothing to redact: pieces pass straight through.
        let none = SecretRedactor::default();
        assert_eq!(none.stream().push("abc"), "abc");
    }
}
