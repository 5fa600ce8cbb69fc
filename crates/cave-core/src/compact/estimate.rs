//! The default token estimator: a script-aware heuristic that never under-counts.

use super::TokenEstimator;

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

/// The cost of one non-ASCII code point, in quarter tokens.
fn rate(c: u32) -> u64 {
    let at = RANGES.partition_point(|&(_, last, _)| last < c);
    match RANGES.get(at) {
        Some(&(first, _, quarters)) if first <= c => quarters,
        _ => DEFAULT,
    }
}

impl ScriptEstimator {
    /// The estimate in quarter tokens (exact: every rate is a multiple of a quarter).
    pub fn quarters(text: &str) -> u64 {
        let bytes = text.as_bytes();
        let mut quarters = 0u64;
        let mut i = 0;
        while i < bytes.len() {
            // ASCII runs, eight bytes at a time where possible.
            while i + 8 <= bytes.len() {
                let word = u64::from_le_bytes([
                    bytes[i],
                    bytes[i + 1],
                    bytes[i + 2],
                    bytes[i + 3],
                    bytes[i + 4],
                    bytes[i + 5],
                    bytes[i + 6],
                    bytes[i + 7],
                ]);
                if word & 0x8080_8080_8080_8080 != 0 {
                    break;
                }
                quarters += 8 * DEFAULT;
                i += 8;
            }
            let Some(&b) = bytes.get(i) else { break };
            if b < 0x80 {
                quarters += DEFAULT;
                i += 1;
                continue;
            }
            // A multi-byte character: `text` is valid UTF-8, so the lead byte gives its width.
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
}
