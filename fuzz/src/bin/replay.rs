//! The stable driver of the fuzz targets: replays each target's committed
//! corpus (`fuzz/corpus/<target>/`), then, for `--seconds N`, feeds it inputs
//! made by mutating that corpus with a seeded generator (byte flips,
//! insertions, deletions, repeats, splices and tokens the parsers care
//! about). Not coverage-guided, as libFuzzer is, but it needs no nightly
//! toolchain and the same seed makes the same inputs. An input that panics,
//! or takes longer than 10 s, is written to `fuzz/artifacts/<target>/` and
//! the run fails.
//!
//!   replay [--seconds N] [--seed S] [TARGET ...]     (no TARGET: all of them)
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mpg_gateway_fuzz::TARGETS;

/// Longest input made.
const MAX_LEN: usize = 4096;

/// Byte strings the parsers give meaning to; a mutation may insert one.
const TOKENS: &[&[u8]] = &[
    b"\r\n", b"\r\n\r\n", b"\n", b" ", b"\t", b":", b";", b",", b"=", b"&", b"%", b"%2e", b"%2F",
    b"%00", b"%zz", b"+", b"/", b"..", b".", b"\\", b"?", b"#", b"\"", b"{", b"}", b"[", b"]",
    b"null", b"0", b"-1", b"18446744073709551616", b"1e309", b"chunked", b"Transfer-Encoding",
    b"Content-Length", b"Host", b"HTTP/1.1", b"HTTP/1.0", b"PROXY TCP4 ", b"PROXY TCP6 ",
    b"PROXY UNKNOWN", b"\r\n\r\n\0\r\nQUIT\n", b"Bearer ", b"mpg_", b"mps_", b"eyJ", b"kty",
    b"RSA", b"EC", b"OKP", b"alg", b"kid", b"[server]", b"[[routes]]", b"\"\"\"", b"'''",
];

/// splitmix64: a small, well-mixed generator; the same seed, the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `input` changed by one to four mutations, `corpus` giving splices.
fn mutate(rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = out.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(len + 1);
                out.insert(i, rng.next() as u8);
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = start + rng.below(len - start) + 1;
                out.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = start + rng.below((len - start).min(64)) + 1;
                let piece = out[start..end].to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, piece);
            }
            5 => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {
                let token = TOKENS[rng.below(TOKENS.len())];
                let at = rng.below(len + 1);
                out.splice(at..at, token.iter().copied());
            }
        }
    }
    out.truncate(MAX_LEN);
    out
}

/// The files of `dir`, in name order (none if it does not exist).
fn read_corpus(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|p| Some((p.clone(), std::fs::read(&p).ok()?)))
        .collect()
}

/// The longest one input may take, in this unoptimised build; libFuzzer's
/// `-timeout` in scripts/fuzz.sh is the same bound for its release build.
const SLOW: Duration = Duration::from_secs(10);

/// Runs `input`; on a panic, or when it takes longer than [`SLOW`], writes it
/// under `artifacts` and says where.
fn run_one(name: &str, target: fn(&[u8]), input: &[u8], artifacts: &Path) -> bool {
    let start = Instant::now();
    let panicked = catch_unwind(AssertUnwindSafe(|| target(input))).is_err();
    let took = start.elapsed();
    let what = match (panicked, took > SLOW) {
        (false, false) => return true,
        (true, _) => "crash",
        (false, true) => "slow",
    };
    let dir = artifacts.join(name);
    let _ = std::fs::create_dir_all(&dir);
    let digest = input
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let path = dir.join(format!("{what}-{digest:016x}"));
    let _ = std::fs::write(&path, input);
    if panicked {
        eprintln!("{name}: an input panicked; written to {}", path.display());
    } else {
        eprintln!("{name}: an input took {took:?}; written to {}", path.display());
    }
    false
}

fn main() {
    let mut seconds = 0u64;
    let mut seed = 1u64;
    let mut chosen = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |flag: &str| -> u64 {
            let value = args.next().unwrap_or_default();
            value.parse().unwrap_or_else(|_| {
                eprintln!("{flag} takes a whole number, not {value:?}");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--seconds" => seconds = number("--seconds"),
            "--seed" => seed = number("--seed"),
            name if TARGETS.iter().any(|(n, _)| *n == name) => chosen.push(name.to_owned()),
            other => {
                let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
                eprintln!("unknown target or flag {other:?}; the targets: {}", names.join(", "));
                std::process::exit(2);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let artifacts = root.join("artifacts");
    // Panics are caught and reported once each, with the input's path.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    let mut failed = false;
    for &(name, target) in TARGETS {
        if !chosen.is_empty() && !chosen.iter().any(|c| c == name) {
            continue;
        }
        let corpus = read_corpus(&root.join("corpus").join(name));
        let mut ok = true;
        for (path, input) in &corpus {
            if !run_one(name, target, input, &artifacts) {
                eprintln!("{name}: corpus input {} fails", path.display());
                ok = false;
            }
        }
        let mut inputs: Vec<Vec<u8>> = corpus.into_iter().map(|(_, input)| input).collect();
        let replayed = inputs.len();
        if inputs.is_empty() {
            inputs.push(Vec::new());
        }
        let mut rng = Rng(seed ^ name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))));
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut made = 0u64;
        while ok && Instant::now() < until {
            for _ in 0..64 {
                let base = &inputs[rng.below(inputs.len())];
                let input = mutate(&mut rng, base, &inputs);
                made += 1;
                if !run_one(name, target, &input, &artifacts) {
                    ok = false;
                    break;
                }
            }
        }
        println!("{name}: {replayed} corpus inputs replayed, {made} generated inputs (seed {seed}): {}",
            if ok { "ok" } else { "FAILED" });
        failed |= !ok;
    }
    if failed {
        std::process::exit(1);
    }
}
