//! Property soaks for the decoders of bytes another party controls (the kernel child's frames,
//! a Jupyter server's messages, a model server's event stream): mutated valid inputs and random
//! bytes, checked to end in a value or an error, never a panic or a hang.
//!
//! Each crate calls [`soak`] from a test with its decoder; `cargo xtask fuzz` runs those tests
//! in release with [`CASES_VAR`] set (a million cases each), and the suite runs a short form.
//! No nightly toolchain is needed (cargo-fuzz's is not available everywhere this builds).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// The environment variable that sets how many cases a soak runs.
pub const CASES_VAR: &str = "CAVE_FUZZ_CASES";

/// Cases a soak runs when [`CASES_VAR`] is not set: the short form the suite runs.
pub const SHORT_CASES: u64 = 20_000;

/// A small, seeded generator (xorshift64*): every run of a soak sees the same cases.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value; zero is replaced).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Returns true with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// Bytes that decoders trip on: lengths at their limits, markers, line breaks.
const INTERESTING: &[&[u8]] = &[
    b"\xff\xff\xff\xff",
    b"\x7f\xff\xff\xff",
    b"\x00\x00\x00\x00",
    b"\x80",
    b"\n\n",
    b"\r\n",
    b"data: ",
    b"\"",
    b"{",
    b"[",
    b"\\u0000",
    b"\xed\xa0\x80",
    b"\xf0\x9f\xa6\x80",
];

/// A mutation of `input`: one to four edits (bit flips, bytes set, cuts, insertions,
/// duplicated or removed slices, interesting byte strings).
pub fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next_u64() as u8;
            }
            2 => out.truncate(at),
            3 => {
                let len = 1 + rng.below(16);
                let extra = rng.bytes(len);
                out.splice(at..at, extra);
            }
            4 if at < out.len() => {
                let end = at + rng.below(out.len() - at + 1);
                let slice = out[at..end].to_vec();
                let to = rng.below(out.len() + 1);
                out.splice(to..to, slice);
            }
            5 if at < out.len() => {
                let end = at + rng.below((out.len() - at).min(64) + 1);
                out.drain(at..end);
            }
            _ => {
                let pick = INTERESTING[rng.below(INTERESTING.len())];
                out.splice(at..at, pick.iter().copied());
            }
        }
    }
    out
}

/// What a soak did.
#[derive(Clone, Debug)]
pub struct Report {
    /// The target's name.
    pub name: String,
    /// Cases run.
    pub cases: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// The slowest case.
    pub slowest: Duration,
    /// Resident memory at the end minus at the start, in bytes (0 if it shrank).
    pub resident_growth: u64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fuzz {}: {} cases in {:.1} s ({:.0}/s), slowest {:.2} ms, resident +{}",
            self.name,
            self.cases,
            self.elapsed.as_secs_f64(),
            self.cases as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.slowest.as_secs_f64() * 1e3,
            cave_core::format_size(self.resident_growth)
        )
    }
}

/// How many cases to run: [`CASES_VAR`] when set, else [`SHORT_CASES`].
pub fn cases() -> u64 {
    std::env::var(CASES_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SHORT_CASES)
}

/// Runs [`cases`] cases of `check` on inputs made from `seeds` (mutated, spliced, or random
/// bytes), seeded by `name`. A panic fails the soak with the input (written to
/// `target/fuzz/NAME.bin` when that directory can be made); so does a case slower than a
/// second. Prints and returns the [`Report`].
pub fn soak(name: &str, seeds: &[Vec<u8>], mut check: impl FnMut(&[u8])) -> Report {
    let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = Rng::new(seed);
    let cases = cases();
    // Warm up once, so that lazily made state is not counted as growth.
    for input in seeds {
        check(input);
    }
    let before = crate::measure::resident_self();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..cases {
        let input = match rng.below(16) {
            0 => {
                let len = rng.below(256);
                rng.bytes(len)
            }
            1 if seeds.len() > 1 => {
                // The head of one seed and the tail of another.
                let (a, b) = (
                    &seeds[rng.below(seeds.len())],
                    &seeds[rng.below(seeds.len())],
                );
                let mut out = a[..rng.below(a.len() + 1)].to_vec();
                out.extend_from_slice(&b[rng.below(b.len() + 1)..]);
                out
            }
            _ if seeds.is_empty() => {
                let len = rng.below(64);
                rng.bytes(len)
            }
            _ => {
                let picked = &seeds[rng.below(seeds.len())];
                mutate(&mut rng, picked)
            }
        };
        let case = Instant::now();
        if catch_unwind(AssertUnwindSafe(|| check(&input))).is_err() {
            let kept = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/fuzz")
                .join(format!("{name}.bin"));
            let saved = std::fs::create_dir_all(kept.parent().unwrap_or(&kept))
                .and_then(|()| std::fs::write(&kept, &input));
            panic!(
                "fuzz {name}: a case panicked (input {} bytes{}): {:?}",
                input.len(),
                if saved.is_ok() {
                    format!(", saved to {}", kept.display())
                } else {
                    String::new()
                },
                String::from_utf8_lossy(&input[..input.len().min(200)])
            );
        }
        let took = case.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "fuzz {name}: a case took {took:?}: {:?}",
            String::from_utf8_lossy(&input[..input.len().min(200)])
        );
        slowest = slowest.max(took);
    }
    let report = Report {
        name: name.to_owned(),
        cases,
        elapsed: started.elapsed(),
        slowest,
        resident_growth: crate::measure::resident_self().saturating_sub(before),
    };
    println!("{report}");
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_near_their_input() {
        let mut rng = Rng::new(7);
        let input = b"data: {\"a\": 1}\n\n".to_vec();
        let mut changed = 0;
        for _ in 0..1000 {
            let out = mutate(&mut rng, &input);
            assert!(out.len() <= input.len() * 3 + 64);
            changed += usize::from(out != input);
        }
        assert!(changed > 900, "{changed}");
    }

    #[test]
    fn a_panicking_decoder_fails_the_soak() {
        let caught = std::panic::catch_unwind(|| {
            soak("self-test", &[b"ok".to_vec()], |input| {
                assert!(!input.contains(&b'!'), "a bang");
            })
        });
        assert!(caught.is_err());
    }
}
