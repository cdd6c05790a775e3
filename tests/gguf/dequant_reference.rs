//! Our dequantization against an independent implementation: `tests/fixtures/gguf/dequant_reference.json`
//! holds random blocks of every type we decode and what gguf-py (llama.cpp's Python package)
//! decodes them to. Bit-for-bit equality is required. `make_dequant_reference.py` rebuilds it.

use serde_json::Value;
use smolchat::gguf::{GgmlType, IntegerParts, dequantize_row, split_row};

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gguf/dequant_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn type_named(name: &str) -> GgmlType {
    *GgmlType::ALL
        .iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no type {name}"))
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn bit_exact_with_gguf_py() {
    let cases = reference()["cases"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 11);
    for case in cases {
        let ty = type_named(case["type"].as_str().unwrap());
        let bytes = hex(case["bytes"].as_str().unwrap());
        let want: Vec<u32> = case["f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, &bytes, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                *w,
                "{ty} element {i}: ours {g}, gguf-py {}",
                f32::from_bits(*w)
            );
        }
    }
}

/// The integers, scales and offsets the CPU kernels multiply, multiplied out, are gguf-py's
/// values: the kernels see exactly the weights the file holds.
#[test]
fn integer_parts_multiply_out_to_gguf_py_values() {
    let mut integer_types = 0;
    for case in reference()["cases"].as_array().unwrap() {
        let ty = type_named(case["type"].as_str().unwrap());
        let Some(sub) = ty.integer_block() else {
            continue;
        };
        integer_types += 1;
        let bytes = hex(case["bytes"].as_str().unwrap());
        let want: Vec<f32> = case["f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| f32::from_bits(v.as_u64().unwrap() as u32))
            .collect();
        let mut q = vec![0i8; want.len()];
        let mut scales = vec![f32::NAN; want.len() / sub];
        let mut offsets = vec![f32::NAN; want.len() / sub];
        let parts = IntegerParts {
            q: &mut q,
            scales: &mut scales,
            offsets: &mut offsets,
        };
        split_row(ty, &bytes, parts).unwrap();
        for (i, (&q, want)) in q.iter().zip(&want).enumerate() {
            let got = scales[i / sub] * f32::from(q) + offsets[i / sub];
            assert_eq!(got, *want, "{ty} element {i}");
        }
        if !ty.has_offsets() {
            assert!(offsets.iter().all(|&o| o == 0.0), "{ty}: offsets are zeros");
        }
    }
    assert_eq!(integer_types, 8, "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K");
}

#[test]
fn type_ids_and_block_sizes_match_gguf_py() {
    let r = reference();
    for (name, id) in r["ids"].as_object().unwrap() {
        let ty = type_named(name);
        assert_eq!(ty.id() as u64, id.as_u64().unwrap(), "{name}");
        let size = &r["sizes"][name];
        let (block, bytes) = (size[0].as_u64().unwrap(), size[1].as_u64().unwrap());
        assert_eq!(ty.block_size() as u64, block, "{name}");
        if ty == GgmlType::Q8_1 {
            // gguf-py still has the old f32 scales (40 bytes); ggml-common.h asserts
            // sizeof(block_q8_1) == 2 * sizeof(ggml_half) + 32. Q8_1 is a vec-dot scratch type
            // that no converter writes to a file.
            assert_eq!((ty.type_size(), bytes), (36, 40));
        } else {
            assert_eq!(ty.type_size() as u64, bytes, "{name}");
        }
    }
}
