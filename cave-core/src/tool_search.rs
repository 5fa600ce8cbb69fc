//! Finding host functions and methods by what they do, from inside the runtime.
//!
//! When the full descriptions of what a host registered would take too much of the prompt,
//! the prompt names each object in a line and the model calls `search_tools(query)` in its
//! code: the agent registers it (see [`AgentBuilder::tool_search`](crate::AgentBuilder)), and
//! it ranks every function and method with BM25 over their names, parameter names and docs.
//! No model call, no network: the index is built from the registry, again whenever what it
//! holds changed (a server's tool list included), and the prompt stays as it was.

use crate::Signature;
use std::collections::HashMap;
use std::fmt::Write as _;

/// When the prompt lists every function and method, and when it names objects only and the
/// model finds the rest with `search_tools`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ToolSearch {
    /// Search when the full descriptions would take more than the listing budget.
    #[default]
    Auto,
    /// Always name objects only, and search.
    Always,
    /// Always list everything; no `search_tools`.
    Never,
}

impl std::str::FromStr for ToolSearch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(format!(
                "unknown tool search mode {other:?}: use auto, always or never"
            )),
        }
    }
}

impl std::fmt::Display for ToolSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Never => "never",
        })
    }
}

/// The most tokens the descriptions of functions, variables and types may take in the system
/// prompt before `auto` tool search names objects only: about 3 % of a 128k window.
pub const DEFAULT_TOOL_LISTING_BUDGET: u64 = 4_000;

/// The name the model calls.
pub const SEARCH_TOOLS: &str = "search_tools";

/// The most matches one search returns.
pub const MAX_SEARCH_RESULTS: usize = 50;

/// How much of one tool's doc a search shows (`help(...)` shows the rest).
const MAX_SHOWN_DOC: usize = 1_500;

/// The longest query read (a model may pass anything).
const MAX_QUERY: usize = 2_000;

/// One function or method, as a search finds and shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolEntry {
    /// How the model calls it: `name` or `object.method`.
    pub path: String,
    /// Its signature.
    pub signature: Signature,
    /// What the host said of it (description and docstring).
    pub doc: String,
    /// What is searched besides: the object's type and description, the parameters' names.
    context: String,
}

impl ToolEntry {
    /// An entry; `context` is searched besides its doc and its parameters' names (the
    /// object's name, type and description for a method).
    pub(crate) fn new(path: String, signature: Signature, doc: String, context: String) -> Self {
        let context = format!("{context} {}", param_names(&signature));
        Self {
            path,
            signature,
            doc,
            context,
        }
    }

    /// The entry as a search result shows it: the call with its signature, then its doc.
    pub fn shown(&self) -> String {
        let mut out = format!("{}{}", self.path, self.signature);
        let doc = self.doc.trim();
        if !doc.is_empty() {
            let (doc, cut) = crate::shorten(doc, MAX_SHOWN_DOC);
            for line in doc.lines() {
                let _ = write!(out, "\n    {line}");
            }
            if cut {
                let _ = write!(out, " … (help({}) shows the rest)", self.path);
            }
        }
        out
    }
}

fn param_names(signature: &Signature) -> String {
    signature
        .params
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// BM25 over the entries' names (weighted up), docs and context.
#[derive(Debug)]
pub struct ToolIndex {
    entries: Vec<ToolEntry>,
    /// Per term, the entries holding it and how often (weighted).
    postings: HashMap<String, Vec<(usize, f32)>>,
    lengths: Vec<f32>,
    average: f32,
}

/// BM25's saturation and length normalisation (less than the usual 0.75: tool docs are
/// short, and their lengths say little of what they are about).
const K1: f32 = 1.2;
const B: f32 = 0.3;
/// Scores whose logarithms fall in one band of this width (about 5 %) rank as ties.
const TIE_BAND: f32 = 0.05;
/// A term in a tool's name counts as this many occurrences.
const NAME_WEIGHT: f32 = 3.0;

impl ToolIndex {
    /// An index of `entries`.
    pub fn new(entries: Vec<ToolEntry>) -> Self {
        let mut postings: HashMap<String, Vec<(usize, f32)>> = HashMap::new();
        let mut lengths = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let mut counts: HashMap<String, f32> = HashMap::new();
            let name = entry.path.rsplit('.').next().unwrap_or(&entry.path);
            for term in terms(name) {
                *counts.entry(term).or_default() += NAME_WEIGHT;
            }
            for text in [entry.doc.as_str(), entry.context.as_str()] {
                for term in terms(text) {
                    *counts.entry(term).or_default() += 1.0;
                }
            }
            lengths.push(counts.values().sum());
            for (term, n) in counts {
                postings.entry(term).or_default().push((i, n));
            }
        }
        let average = if lengths.is_empty() {
            1.0
        } else {
            (lengths.iter().sum::<f32>() / lengths.len() as f32).max(1.0)
        };
        Self {
            entries,
            postings,
            lengths,
            average,
        }
    }

    /// The entries indexed.
    pub fn entries(&self) -> &[ToolEntry] {
        &self.entries
    }

    /// The best `limit` matches for `query`, best first, with their scores (none that share no
    /// term with it).
    pub fn search(&self, query: &str, limit: usize) -> Vec<(&ToolEntry, f32)> {
        let (query, _) = crate::shorten(query, MAX_QUERY);
        let mut query_terms = terms(query);
        query_terms.sort();
        query_terms.dedup();
        let n = self.entries.len() as f32;
        let mut scores: HashMap<usize, f32> = HashMap::new();
        for term in &query_terms {
            let Some(posting) = self.postings.get(term) else {
                continue;
            };
            let df = posting.len() as f32;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for &(i, tf) in posting {
                let norm = K1 * (1.0 - B + B * self.lengths[i] / self.average);
                *scores.entry(i).or_default() += idf * tf * (K1 + 1.0) / (tf + norm);
            }
        }
        let mut ranked: Vec<(usize, f32)> = scores.into_iter().collect();
        // Scores within a few percent are ties, in the order the host registered them: for
        // short docs that match the same words, BM25's length normalisation is noise, and a
        // server lists its main operations first.
        let band = |score: f32| (score.max(f32::MIN_POSITIVE).ln() / TIE_BAND).floor() as i64;
        ranked.sort_by(|a, b| band(b.1).cmp(&band(a.1)).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(limit.min(MAX_SEARCH_RESULTS))
            .map(|(i, score)| (&self.entries[i], score))
            .collect()
    }

    /// What `search_tools` returns: the matches, shown, or what to do when there are none.
    pub fn answer(&self, query: &str, limit: usize) -> String {
        let found = self.search(query, limit);
        if found.is_empty() {
            return crate::prompt::no_tools_found(query, self.entries.len());
        }
        found
            .iter()
            .map(|(entry, _)| entry.shown())
            .collect::<Vec<_>>()
            .join("\n\n")
    }
}

/// Words that say nothing of what a tool does.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "given",
    "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or",
    "please", "that", "the", "their", "them", "then", "this", "to", "want", "was", "what", "when",
    "which", "with", "you", "your",
];

/// Words that mean one thing to a tool, each group said as its first word. Tools share a
/// small vocabulary of operations (get, list, create, delete ...) that people and models say
/// in many words ("remove", "fetch", "sign off"), and of the things business and developer
/// tools work on ("client" for "customer", "repo" for "repository"); a lexical ranker knows
/// no synonyms but these.
const SYNONYMS: &[&[&str]] = &[
    &[
        "create", "add", "new", "insert", "register", "raise", "submit", "book",
    ],
    &["update", "edit", "modify", "alter", "amend", "rename"],
    &[
        "delete", "remove", "erase", "destroy", "purge", "cancel", "drop",
    ],
    &["get", "fetch", "retrieve", "lookup", "view", "inspect"],
    &["list", "all", "browse", "enumerate"],
    &["search", "find", "query", "look", "seek", "mention"],
    &["count", "number", "tally"],
    &["summarize", "summarise", "total", "sum", "aggregate"],
    &["export", "download", "dump"],
    &["import", "upload", "load", "ingest"],
    &["assign", "give", "hand", "allocate", "delegate"],
    &["tag", "label", "categorize", "categorise"],
    &["comment", "note", "annotate", "remark", "reply"],
    &["approve", "accept", "confirm", "authorize", "authorise"],
    &["reject", "decline", "deny", "refuse", "dismiss"],
    &["duplicate", "copy", "clone"],
    &["merge", "combine", "join", "fold", "consolidate", "unify"],
    &["history", "log", "changelog", "audit", "timeline"],
    &["archive", "retire", "shelve"],
    &[
        "restore",
        "unarchive",
        "recover",
        "reinstate",
        "undelete",
        "revive",
    ],
    &["id", "identifier"],
    &["customer", "client", "buyer"],
    &["supplier", "vendor"],
    &["lead", "prospect"],
    &["invoice", "bill"],
    &["ticket", "issue"],
    &["employee", "staff", "worker", "teammate", "colleague"],
    &["document", "doc"],
    &["email", "mail"],
    &["repository", "repo"],
    &["directory", "folder"],
    &["image", "picture", "photo"],
];

/// Two words that say one operation: `(first, second, the operation)`.
const PHRASES: &[(&str, &str, &str)] = &[
    ("how", "many", "count"),
    ("look", "up", "get"),
    ("sign", "off", "approve"),
    ("turn", "down", "reject"),
    ("bring", "back", "restore"),
];

/// A stemmed word → its [`SYNONYMS`] group's stemmed first word.
fn synonym(stemmed: &str) -> Option<&'static str> {
    static GROUPS: std::sync::LazyLock<HashMap<String, String>> = std::sync::LazyLock::new(|| {
        let mut map = HashMap::new();
        for group in SYNONYMS {
            for word in *group {
                map.insert(stem(word), stem(group[0]));
            }
        }
        map
    });
    GROUPS.get(stemmed).map(String::as_str)
}

/// The terms of a text: words split at non-alphanumerics, `snake_case` and `camelCase`
/// boundaries, lowercased, stemmed, stop words left out, synonyms and phrases made one.
pub(crate) fn terms(text: &str) -> Vec<String> {
    let words = words(text);
    let mut out = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        let phrase = words.get(i + 1).and_then(|next| {
            PHRASES
                .iter()
                .find(|(a, b, _)| *a == words[i] && b == next)
                .map(|(_, _, meaning)| *meaning)
        });
        let word = match phrase {
            Some(meaning) => {
                i += 1;
                meaning
            }
            None => words[i].as_str(),
        };
        i += 1;
        if STOP_WORDS.contains(&word) {
            continue;
        }
        let stemmed = stem(word);
        out.push(synonym(&stemmed).map_or(stemmed, str::to_owned));
    }
    out
}

/// The words of a text, lowercased: split at non-alphanumerics, `snake_case` and `camelCase`
/// boundaries and between letters and digits.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut previous: Option<char> = None;
    let flush = |word: &mut String, out: &mut Vec<String>| {
        if !word.is_empty() {
            out.push(word.to_lowercase());
            word.clear();
        }
    };
    for c in text.chars() {
        if !c.is_alphanumeric() {
            flush(&mut word, &mut out);
            previous = None;
            continue;
        }
        if let Some(p) = previous
            && ((p.is_lowercase() && c.is_uppercase()) || (p.is_alphabetic() != c.is_alphabetic()))
        {
            flush(&mut word, &mut out);
        }
        word.push(c);
        previous = Some(c);
    }
    flush(&mut word, &mut out);
    out
}

/// A light suffix stemmer (English): enough that `forecasts`, `forecasting` and `forecast`
/// meet, not a linguist's.
fn stem(word: &str) -> String {
    if word.len() <= 3 || !word.is_ascii() {
        return word.to_owned();
    }
    let mut w = word.to_owned();
    for (suffix, replacement) in [
        ("ies", "y"),
        ("sses", "ss"),
        ("ing", ""),
        ("edly", ""),
        ("ed", ""),
        ("es", ""),
        ("s", ""),
    ] {
        if w.len() > suffix.len() + 2 && w.ends_with(suffix) && !w.ends_with("ss") {
            w.truncate(w.len() - suffix.len());
            w.push_str(replacement);
            break;
        }
    }
    for (suffix, replacement) in [
        ("ation", "ate"),
        ("ization", "ize"),
        ("ment", ""),
        ("ness", ""),
        ("ly", ""),
        ("er", ""),
        ("e", ""),
    ] {
        if w.len() > suffix.len() + 3 && w.ends_with(suffix) {
            w.truncate(w.len() - suffix.len());
            w.push_str(replacement);
            break;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Param, Signature};

    fn entry(path: &str, params: &[&str], doc: &str) -> ToolEntry {
        ToolEntry::new(
            path.to_owned(),
            Signature::new(params.iter().map(|p| Param::new(*p))),
            doc.to_owned(),
            String::new(),
        )
    }

    #[test]
    fn terms_split_names_and_meet_across_forms() {
        assert_eq!(terms("getWeatherForecast"), terms("get weather forecast"));
        assert_eq!(terms("the weather of Paris"), terms("weather Paris"));
        assert_eq!(terms("list_open_issues"), terms("List open issue"));
        assert_eq!(
            terms("Forecasting the forecasts"),
            terms("forecast forecast")
        );
        assert_eq!(terms("utf8 v2api"), ["utf", "8", "v", "2", "api"]);
        assert!(terms("").is_empty());
    }

    #[test]
    fn the_tool_that_says_it_does_it_comes_first() {
        let index = ToolIndex::new(vec![
            entry(
                "srv.send_email",
                &["to", "subject", "body"],
                "Sends an email message.",
            ),
            entry(
                "srv.weather_forecast",
                &["city", "days"],
                "Forecast of the weather for a city.",
            ),
            entry(
                "srv.convert_temperature",
                &["value", "unit"],
                "Converts a temperature between Celsius and Fahrenheit.",
            ),
            entry(
                "srv.list_issues",
                &["repo"],
                "Lists the open issues of a repository.",
            ),
        ]);
        let top = |q: &str| index.search(q, 1).first().map(|(e, _)| e.path.clone());
        assert_eq!(
            top("what will the weather be in Paris"),
            Some("srv.weather_forecast".into())
        );
        assert_eq!(
            top("fahrenheit to celsius"),
            Some("srv.convert_temperature".into())
        );
        assert_eq!(top("mail someone"), Some("srv.send_email".into()));
        assert_eq!(top("zebra crossing"), None, "no shared term, no match");
        assert_eq!(top("open issues in a repo"), Some("srv.list_issues".into()));
        assert_eq!(index.search("temperature weather", 5).len(), 2);
        assert!(index.search("", 5).is_empty());
        let answer = index.answer("email", 5);
        assert!(
            answer.starts_with("srv.send_email(to, subject, body)\n    Sends an email message."),
            "{answer}"
        );
        assert!(index.answer("zebra", 5).contains("zebra"));
    }

    #[test]
    fn synonyms_and_phrases_meet() {
        assert_eq!(terms("Remove a client"), terms("delete customer"));
        assert_eq!(terms("how many vendors"), terms("count suppliers"));
        assert_eq!(
            terms("look up the bill by id"),
            terms("get invoice identifier")
        );
        assert_eq!(terms("bring back"), terms("restore"));
        assert_eq!(
            terms("how"),
            Vec::<String>::new(),
            "half a phrase is itself"
        );
        assert_eq!(terms("up"), ["up"]);
    }

    #[test]
    fn near_ties_keep_the_hosts_order() {
        // Same words, docs of a little different lengths: the host's order decides.
        let index = ToolIndex::new(vec![
            entry("get_parcel", &[], "Fetches one parcel."),
            entry("list_parcel", &[], "Lists every parcel, newest first."),
            entry("drop_parcel", &[], "Drops a parcel."),
        ]);
        let order: Vec<_> = index
            .search("parcel", 3)
            .iter()
            .map(|(e, _)| e.path.as_str())
            .collect();
        assert_eq!(order, ["get_parcel", "list_parcel", "drop_parcel"]);
    }

    #[test]
    fn hostile_queries_are_bounded() {
        let index = ToolIndex::new(vec![entry("f", &[], "does f")]);
        let long = "f ".repeat(1_000_000);
        assert_eq!(index.search(&long, usize::MAX).len(), 1);
        assert_eq!("auto".parse::<ToolSearch>().unwrap().to_string(), "auto");
        assert!("sometimes".parse::<ToolSearch>().is_err());
    }
}
