//! Fuzzing the header and metadata parser: random bytes, and real and hand-built headers that
//! are truncated, flipped and given lying counts. Every input must end in `Ok` or a named
//! error (a panic fails the test), and the parser's peak allocation must stay within a small
//! multiple of the input's size however large the counts it reads.
//!
//! `cargo test --test gguf fuzz` runs the bounded cases; `GGUF_FUZZ_SECS=120 cargo test --test gguf fuzz
//! -- --ignored` runs the random mutation loop for that long.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use super::builder::{Builder, V};
use proptest::prelude::*;
use smolchat::gguf::{GgmlType, GgufFile, MetadataArray, MetadataValue};

// --- allocation accounting: per thread, so parallel tests do not disturb each other ---

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // `try_with`: the allocator also runs while threads are torn down.
    let _ = LIVE.try_with(|live| {
        let now = live.get().wrapping_add(delta);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        track(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns the most bytes it had allocated at once on this thread.
fn peak_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, (PEAK.with(Cell::get) - base).max(0) as usize)
}

/// Allocation allowed for parsing `len` bytes. The worst case is metadata made of the smallest
/// possible entries (13 bytes each for a ~100-byte entry and index slot), about 10×.
fn allocation_budget(len: usize) -> usize {
    32 * len + (1 << 20)
}

/// Parses `bytes`; if the file is accepted, also reads every tensor, so accepted mutants
/// exercise the data paths too. Panics (failing the test) only if memory use is out of bounds.
fn parse_and_use(bytes: &[u8]) -> usize {
    let input = bytes.to_vec();
    let (result, peak) = peak_allocation(|| GgufFile::from_bytes("fuzz.gguf", input));
    assert!(
        peak <= allocation_budget(bytes.len()),
        "{peak} bytes allocated for a {}-byte input",
        bytes.len()
    );
    if let Ok(file) = result {
        for info in file.tensors() {
            let t = file.tensor(&info.name).unwrap();
            // Skip tensors whose f32 expansion would be large; their bytes are in the file.
            if info.n_elements < 1 << 20 {
                let _ = t.to_f32_vec();
            }
            if info.n_rows() > 0 && info.row_len() < 1 << 20 {
                let mut row = vec![0f32; info.row_len() as usize];
                let _ = t.dequantize_row(info.n_rows() - 1, &mut row);
            }
        }
        let _ = file.get_u32("general.alignment");
        let _ = smolchat::gguf::GgufConfig::from_gguf(&file);
    }
    peak
}

// --- inputs ---

/// A hand-built file with every value type, nested arrays and several tensor types.
fn synthetic() -> Vec<u8> {
    let q8 = {
        let mut b = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend((0..32u8).map(|i| i.wrapping_mul(7)));
        b
    };
    Builder::default()
        .kv("general.architecture", V::str("llama"))
        .kv("general.alignment", V::U32(32))
        .kv("u8", V::U8(1))
        .kv("i16", V::I16(-2))
        .kv("u64", V::U64(3))
        .kv("f64", V::F64(4.0))
        .kv("b", V::Bool(false))
        .kv("tokens", V::strs(&["<s>", "a", "b", "ab"]))
        .kv(
            "nested",
            V::Arr(
                9,
                vec![V::Arr(5, vec![V::I32(1)]), V::Arr(8, vec![V::str("x")])],
            ),
        )
        .f32_tensor("norm", &[4], &[1.0, 2.0, 3.0, 4.0])
        .tensor("q8", &[32, 1], GgmlType::Q8_0.id(), q8)
        .tensor("q4k", &[256], GgmlType::Q4_K.id(), vec![0x11; 144])
        .tensor("iq", &[256], GgmlType::IQ2_XXS.id(), vec![0; 66])
        .build()
}

/// The real file's header, shrunk: its metadata with each array cut to 64 entries, then its
/// 272 tensor infos verbatim, and no data. Parsing it ends at the tensors' bounds check, after
/// going through every kind of entry the real file has.
fn real_skeleton() -> Vec<u8> {
    let path = super::builder::real_model();
    let file = GgufFile::open(&path).expect("the real file opens");
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((file.tensors().len() as u64).to_le_bytes());
    out.extend((file.metadata().len() as u64).to_le_bytes());
    for (key, value) in file.metadata().iter() {
        super::builder::write_str(&mut out, key);
        write_value(&mut out, value, 64);
    }
    for t in file.tensors() {
        super::builder::write_str(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        t.dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(t.ggml_type.id().to_le_bytes());
        out.extend(t.offset.to_le_bytes());
    }
    out
}

/// Serializes a parsed value (type tag first), keeping at most `max_len` array elements.
fn write_value(out: &mut Vec<u8>, v: &MetadataValue, max_len: usize) {
    let (tag, body): (u32, Vec<u8>) = match v {
        MetadataValue::U8(x) => (0, vec![*x]),
        MetadataValue::I8(x) => (1, vec![*x as u8]),
        MetadataValue::U16(x) => (2, x.to_le_bytes().to_vec()),
        MetadataValue::I16(x) => (3, x.to_le_bytes().to_vec()),
        MetadataValue::U32(x) => (4, x.to_le_bytes().to_vec()),
        MetadataValue::I32(x) => (5, x.to_le_bytes().to_vec()),
        MetadataValue::F32(x) => (6, x.to_le_bytes().to_vec()),
        MetadataValue::Bool(x) => (7, vec![*x as u8]),
        MetadataValue::String(s) => {
            let mut b = Vec::new();
            super::builder::write_str(&mut b, s);
            (8, b)
        }
        MetadataValue::Array(a) => {
            let mut b = Vec::new();
            write_array(&mut b, a, max_len);
            (9, b)
        }
        MetadataValue::U64(x) => (10, x.to_le_bytes().to_vec()),
        MetadataValue::I64(x) => (11, x.to_le_bytes().to_vec()),
        MetadataValue::F64(x) => (12, x.to_le_bytes().to_vec()),
    };
    out.extend(tag.to_le_bytes());
    out.extend(body);
}

fn write_array(out: &mut Vec<u8>, a: &MetadataArray, max_len: usize) {
    macro_rules! nums {
        ($tag:expr, $v:expr) => {{
            let v = &$v[..$v.len().min(max_len)];
            out.extend(($tag as u32).to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        }};
    }
    match a {
        MetadataArray::U8(v) => nums!(0, v),
        MetadataArray::I8(v) => nums!(1, v),
        MetadataArray::U16(v) => nums!(2, v),
        MetadataArray::I16(v) => nums!(3, v),
        MetadataArray::U32(v) => nums!(4, v),
        MetadataArray::I32(v) => nums!(5, v),
        MetadataArray::F32(v) => nums!(6, v),
        MetadataArray::Bool(v) => nums!(7, v.iter().map(|&b| b as u8).collect::<Vec<_>>()),
        MetadataArray::String(v) => {
            let v = &v[..v.len().min(max_len)];
            out.extend(8u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            v.iter().for_each(|s| super::builder::write_str(out, s));
        }
        MetadataArray::Array(v) => {
            let v = &v[..v.len().min(max_len)];
            out.extend(9u32.to_le_bytes());
            out.extend((v.len() as u64).to_le_bytes());
            v.iter().for_each(|a| write_array(out, a, max_len));
        }
        MetadataArray::U64(v) => nums!(10, v),
        MetadataArray::I64(v) => nums!(11, v),
        MetadataArray::F64(v) => nums!(12, v),
    }
}

/// The first `n` bytes of the real file.
fn real_prefix(n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0; n];
    std::fs::File::open(super::builder::real_model())
        .and_then(|mut file| file.read_exact(&mut buf))
        .expect("the real file reads");
    buf
}

/// Values that make a count, length, type or dimension lie in an interesting way.
const NASTY_U64: &[u64] = &[
    0,
    1,
    2,
    31,
    32,
    255,
    0xFFFF,
    0xFFFF_FFFF,
    1 << 32,
    1 << 40,
    (1 << 61) + 1,
    i64::MAX as u64,
    u64::MAX - 7,
    u64::MAX,
];

// --- deterministic sweeps ---

#[test]
fn skeleton_of_the_real_header_parses_until_the_data() {
    let skeleton = real_skeleton();
    let err = GgufFile::from_bytes("skeleton", skeleton).unwrap_err();
    assert!(err.to_string().contains("token_embd.weight"), "{err}");
}

#[test]
fn real_header_truncated_at_every_offset_of_its_first_8k() {
    let prefix = real_prefix(8192);
    for len in 0..prefix.len() {
        let bytes = prefix[..len].to_vec();
        assert!(
            GgufFile::from_bytes("t", bytes).is_err(),
            "a {len}-byte prefix cannot be a whole file"
        );
    }
}

#[test]
fn every_field_of_the_first_4k_replaced_by_lies() {
    let prefix = real_prefix(64 * 1024);
    let mut max_peak = 0;
    for at in 0..4096 {
        for &v in [u64::MAX, 1 << 40, 0].iter() {
            let mut bytes = prefix.clone();
            bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
            max_peak = max_peak.max(parse_and_use(&bytes));
        }
    }
    eprintln!("peak allocation over 12288 lying 64 KiB headers: {max_peak} bytes");
}

#[test]
fn every_byte_of_a_synthetic_file_mutated() {
    let base = synthetic();
    assert!(GgufFile::from_bytes("s", base.clone()).is_ok());
    let mut accepted = 0;
    for at in 0..base.len() {
        for v in [0u8, 1, 0x7F, 0x80, 0xFF, base[at] ^ 0x01, base[at] ^ 0x80] {
            let mut bytes = base.clone();
            bytes[at] = v;
            parse_and_use(&bytes);
            accepted += GgufFile::from_bytes("s", bytes).is_ok() as usize;
        }
        parse_and_use(&base[..at]);
    }
    eprintln!(
        "{accepted} of {} single-byte mutants accepted",
        base.len() * 7
    );
}

// --- property tests ---

fn corpus() -> Vec<Vec<u8>> {
    let mut c = vec![synthetic()];
    c.push(real_prefix(16 * 1024));
    c.push(real_skeleton());
    c
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, mask: u8 },
    Lie { at: usize, value: u64 },
    Truncate { at: usize },
    Splice { at: usize, bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (any::<usize>(), prop::sample::select(NASTY_U64))
            .prop_map(|(at, value)| Mutation::Lie { at, value }),
        (any::<usize>(), any::<u64>()).prop_map(|(at, value)| Mutation::Lie { at, value }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 0..16))
            .prop_map(|(at, bytes)| Mutation::Splice { at, bytes }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Flip { at, mask } => {
            let i = at % bytes.len();
            bytes[i] ^= mask;
        }
        Mutation::Lie { at, value } => {
            let i = at % bytes.len();
            let end = (i + 8).min(bytes.len());
            bytes[i..end].copy_from_slice(&value.to_le_bytes()[..end - i]);
        }
        Mutation::Truncate { at } => bytes.truncate(at % bytes.len()),
        Mutation::Splice { at, bytes: insert } => {
            let i = at % bytes.len();
            bytes.splice(i..i, insert.iter().copied());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048), gguf_prefix in any::<bool>()) {
        let mut input = if gguf_prefix { b"GGUF\x03\0\0\0".to_vec() } else { Vec::new() };
        input.extend(bytes);
        parse_and_use(&input);
    }

    #[test]
    fn mutated_headers(which in 0usize..3, mutations in prop::collection::vec(mutation(), 1..6)) {
        let corpus = corpus();
        let mut bytes = corpus[which % corpus.len()].clone();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        parse_and_use(&bytes);
    }
}

// --- the long run ---

/// xorshift64*: a fixed-seed generator so a failing run can be repeated from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
#[ignore = "runs for GGUF_FUZZ_SECS (default 120); run with --ignored"]
fn fuzz_for_a_while() {
    let secs: u64 = std::env::var("GGUF_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let seed: u64 = std::env::var("GGUF_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_CAFE);
    let corpus = corpus();
    let mut rng = Rng(seed);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut runs, mut accepted, mut max_ratio, mut max_peak) = (0u64, 0u64, 0f64, 0usize);
    while Instant::now() < deadline {
        let mut bytes = corpus[rng.below(corpus.len())].clone();
        for _ in 0..1 + rng.below(8) {
            let at = rng.below(bytes.len());
            let m = match rng.below(5) {
                0 => Mutation::Flip {
                    at,
                    mask: 1 << rng.below(8),
                },
                1 => Mutation::Lie {
                    at,
                    value: NASTY_U64[rng.below(NASTY_U64.len())],
                },
                2 => Mutation::Lie {
                    at,
                    value: rng.next() >> rng.below(64),
                },
                3 => Mutation::Truncate {
                    at: at.max(bytes.len() / 2 + rng.below(bytes.len() / 2)),
                },
                _ => Mutation::Splice {
                    at,
                    bytes: (0..rng.below(16)).map(|_| rng.next() as u8).collect(),
                },
            };
            apply(&mut bytes, &m);
        }
        let peak = parse_and_use(&bytes);
        accepted += GgufFile::from_bytes("f", bytes.clone()).is_ok() as u64;
        max_peak = max_peak.max(peak);
        max_ratio = max_ratio.max(peak as f64 / bytes.len().max(1) as f64);
        runs += 1;
    }
    eprintln!(
        "fuzzed {runs} inputs in {secs} s (seed {seed:#x}): {accepted} accepted, no panics; \
         peak parser allocation {max_peak} bytes, at most {max_ratio:.1}× the input"
    );
}
