//! The facade's token estimator: a script-aware heuristic that never under-counts.

use cave_core::TokenEstimator;

/// Estimates tokens from character classes, never under-counting the scripts that tokenize
/// densely: a quarter token per character for Latin text, digits, punctuation and spaces;
/// 1.25 for CJK, Japanese kana, Hangul and full-width forms, and for Greek, Cyrillic, Arabic,
/// Syriac, Thaana and Thai; 1.75 for Hebrew, Devanagari and the other Indic scripts and
/// Sinhala; 3.5 for Armenian, Tibetan, Myanmar, Georgian, Ethiopic, Cherokee, emoji, emoji
/// joiners and variation selectors; 4 for supplementary ideographs. The classes are disjoint;
/// the sum is rounded down.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScriptEstimator;

/// Quarter tokens per character, by class.
const DEFAULT: u64 = 1;
const CJK: u64 = 5;
const LIGHT: u64 = 5;
const DENSE: u64 = 7;
const RARE: u64 = 14;
const SUPPLEMENTARY: u64 = 16;

/// `(first, last, quarter tokens)` per class range, sorted and disjoint (a test checks it).
const RANGES: &[(u32, u32, u64)] = &[
    (0x0370, 0x03FF, LIGHT),
    (0x0400, 0x052F, LIGHT),
    (0x0530, 0x058F, RARE),
    (0x0590, 0x05FF, DENSE),
    (0x0600, 0x06FF, LIGHT),
    (0x0700, 0x077F, LIGHT),
    (0x0780, 0x07BF, LIGHT),
    (0x0900, 0x097F, DENSE),
    (0x0980, 0x0BFF, DENSE),
    (0x0C00, 0x0D7F, DENSE),
    (0x0D80, 0x0DFF, DENSE),
    (0x0E00, 0x0EFF, LIGHT),
    (0x0F00, 0x0FFF, RARE),
    (0x1000, 0x109F, RARE),
    (0x10A0, 0x10FF, RARE),
    (0x1200, 0x139F, RARE),
    (0x13A0, 0x13FF, RARE),
    (0x200D, 0x200D, RARE),
    (0x2600, 0x27BF, RARE),
    (0x3000, 0x303F, CJK),
    (0x3040, 0x309F, CJK),
    (0x30A0, 0x30FF, CJK),
    (0x3400, 0x4DBF, CJK),
    (0x4E00, 0x9FFF, CJK),
    (0xAC00, 0xD7AF, CJK),
    (0xF900, 0xFAFF, CJK),
    (0xFE00, 0xFE0F, RARE),
    (0xFF00, 0xFFEF, CJK),
    (0x1F000, 0x1F2FF, RARE),
    (0x1F300, 0x1FAFF, RARE),
    (0x20000, 0x2FFFF, SUPPLEMENTARY),
];

/// A page of 256 code points whose characters do not all cost the same (see [`PAGES`]).
const MIXED: u8 = 0;

/// The cost of every character of each page of the Basic Multilingual Plane (code point >> 8),
/// or [`MIXED`] where a class starts or ends inside the page: one lookup for almost every
/// character, CJK included, instead of a search of [`RANGES`].
const PAGES: [u8; 256] = pages();

const fn pages() -> [u8; 256] {
    let mut pages = [DEFAULT as u8; 256];
    let mut page = 0;
    while page < 256 {
        let first = (page as u32) << 8;
        let last = first + 0xFF;
        let mut r = 0;
        while r < RANGES.len() {
            let (from, to, quarters) = RANGES[r];
            if from <= last && to >= first {
                pages[page] = if from <= first && to >= last {
                    quarters as u8
                } else {
                    MIXED
                };
            }
            r += 1;
        }
        page += 1;
    }
    pages
}

/// The cost of one non-ASCII code point, in quarter tokens.
#[inline]
fn rate(c: u32) -> u64 {
    if let Some(&quarters) = PAGES.get((c >> 8) as usize)
        && quarters != MIXED
    {
        return u64::from(quarters);
    }
    let at = RANGES.partition_point(|&(_, last, _)| last < c);
    match RANGES.get(at) {
        Some(&(first, _, quarters)) if first <= c => quarters,
        _ => DEFAULT,
    }
}

/// How many bytes `bytes` starts with are ASCII: 32 at a time, then 8, then one.
#[inline]
fn ascii_prefix(bytes: &[u8]) -> usize {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let word = |at: &[u8]| u64::from_le_bytes(at[..8].try_into().expect("8 bytes"));
    let mut n = 0;
    for block in bytes.chunks_exact(32) {
        if (word(block) | word(&block[8..]) | word(&block[16..]) | word(&block[24..])) & HIGH != 0 {
            break;
        }
        n += 32;
    }
    for block in bytes[n..].chunks_exact(8) {
        if word(block) & HIGH != 0 {
            break;
        }
        n += 8;
    }
    n + bytes[n..].iter().take_while(|b| b.is_ascii()).count()
}

impl ScriptEstimator {
    /// The estimate in quarter tokens (exact: every rate is a multiple of a quarter).
    pub fn quarters(text: &str) -> u64 {
        let bytes = text.as_bytes();
        let mut quarters = 0u64;
        let mut i = 0;
        while i < bytes.len() {
            // An ASCII run: a quarter each.
            let ascii = ascii_prefix(&bytes[i..]);
            quarters += ascii as u64 * DEFAULT;
            i += ascii;
            // Then the multi-byte characters up to the next ASCII byte. `text` is valid UTF-8,
            // so each lead byte gives its character's width.
            while let Some(&b) = bytes.get(i)
                && b >= 0x80
            {
                let (width, lead) = match b {
                    0xC0..=0xDF => (2, u32::from(b & 0x1F)),
                    0xE0..=0xEF => (3, u32::from(b & 0x0F)),
                    _ => (4, u32::from(b & 0x07)),
                };
                let mut c = lead;
                for &cont in &bytes[i + 1..(i + width).min(bytes.len())] {
                    c = (c << 6) | u32::from(cont & 0x3F);
                }
                quarters += rate(c);
                i += width;
            }
        }
        quarters
    }
}

impl TokenEstimator for ScriptEstimator {
    fn estimate(&self, text: &str) -> u64 {
        Self::quarters(text) / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_examples() {
        let e = ScriptEstimator;
        assert_eq!(e.estimate("hello world"), 2);
        assert_eq!(e.estimate(&"你好世界".repeat(10)), 50);
        assert_eq!(e.estimate(&format!("你好世界{}", "a".repeat(96))), 29);
        assert_eq!(e.estimate(""), 0);
        // The fast ASCII path and the per-character path agree.
        let text = "abcdefghij".repeat(7) + "é" + &"xyz".repeat(5);
        assert_eq!(ScriptEstimator::quarters(&text), 70 + 1 + 15);
    }

    #[test]
    fn classes_are_disjoint_and_sorted() {
        for pair in RANGES.windows(2) {
            assert!(
                pair[0].1 < pair[1].0,
                "{:x?} overlaps {:x?}",
                pair[0],
                pair[1]
            );
        }
        for &(first, last, quarters) in RANGES {
            assert!(first <= last);
            assert_eq!((rate(first), rate(last)), (quarters, quarters));
        }
        assert_eq!(rate(0x00E9), 1, "Latin-1 letters are default");
        assert_eq!(rate(0x1FBFE), 1);
    }

    /// The per-character rate by searching the ranges alone: what the page table must agree
    /// with.
    fn searched(c: u32) -> u64 {
        RANGES
            .iter()
            .find(|&&(first, last, _)| first <= c && c <= last)
            .map_or(DEFAULT, |&(_, _, q)| q)
    }

    #[test]
    fn the_page_table_agrees_with_the_ranges_for_every_code_point() {
        for c in (0x80..=0x10FFFF).filter_map(char::from_u32) {
            assert_eq!(rate(c as u32), searched(c as u32), "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn every_split_of_ascii_and_other_text_sums_per_character() {
        let pieces = [
            "a",
            "abcdefgh",
            &"x".repeat(33),
            "é",
            "你",
            "😀",
            "\u{200D}",
            "ש",
            " ",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut text = String::new();
            for _ in 0..(state % 40) {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                text.push_str(pieces[(state >> 33) as usize % pieces.len()]);
            }
            let expected: u64 = text
                .chars()
                .map(|c| {
                    if c.is_ascii() {
                        DEFAULT
                    } else {
                        searched(c as u32)
                    }
                })
                .sum();
            assert_eq!(ScriptEstimator::quarters(&text), expected, "{text:?}");
        }
    }
}
