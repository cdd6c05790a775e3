//! A GGUF file's integer weights as the CPU kernels hold them: a fused projection whose parts
//! are stored in different types (as in a Q4_K_M file) against the same parts dequantized.

use burn::tensor::DType;
use smolchat::gguf::{GgmlType, GgufFile};
use smolchat::model::checkpoint::gguf::GgufCheckpoint;
use smolchat::model::checkpoint::{Checkpoint, LayerRole, RowOrder, TensorRole};
use smolchat::model::{BlockFactors, IntegerValues};

use super::builder::Builder;

const COLS: usize = 256;
const HEAD_DIM: usize = 4;

/// `rows` rows of `ty` with varied integers and the f16 scales (and minimums) set to finite
/// values: `scale_at` lists each block's scale fields, by byte offset.
fn blocks(ty: GgmlType, rows: usize, scale_at: &[usize], seed: u32) -> Vec<u8> {
    let blocks = rows * COLS / ty.block_size();
    let mut state = seed;
    let mut bytes = Vec::with_capacity(blocks * ty.type_size());
    for b in 0..blocks {
        let mut block: Vec<u8> = (0..ty.type_size())
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect();
        for (k, &at) in scale_at.iter().enumerate() {
            let scale = half::f16::from_f32(
                0.01 * (1 + (b + k) % 7) as f32 * if k == 1 { -1.0 } else { 1.0 },
            );
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
        bytes.extend(block);
    }
    bytes
}

#[test]
fn mixed_types_stack_into_integers_equal_to_the_dequantized_weights() {
    // A query projection in Q4_K (its rows reordered within heads, as llama.cpp stores them),
    // a key projection in Q6_K (16-element sub-blocks, no offsets) and a value projection in
    // Q4_1 (32-element blocks with offsets): the stack takes the finest block and offsets.
    let parts = [
        (
            LayerRole::Query,
            "blk.0.attn_q.weight",
            GgmlType::Q4_K,
            8,
            vec![0, 2],
        ),
        (
            LayerRole::Key,
            "blk.0.attn_k.weight",
            GgmlType::Q6_K,
            4,
            vec![208],
        ),
        (
            LayerRole::Value,
            "blk.0.attn_v.weight",
            GgmlType::Q4_1,
            4,
            vec![0, 2],
        ),
    ];
    let mut builder = Builder::default();
    for (seed, (_, name, ty, rows, scale_at)) in parts.iter().enumerate() {
        let data = blocks(*ty, *rows, scale_at, seed as u32 + 1);
        builder = builder.tensor(name, &[COLS as u64, *rows as u64], ty.id(), data);
    }
    let file = GgufFile::from_bytes("mixed.gguf", builder.build()).expect("a valid file");
    let checkpoint = GgufCheckpoint::new(file, Some(HEAD_DIM));
    let shaped: Vec<(TensorRole, Vec<usize>)> = parts
        .iter()
        .map(|(role, _, _, rows, _)| (TensorRole::Layer(0, *role), vec![*rows, COLS]))
        .collect();

    // The CPU holds such parts apart, each as stored; the stack of all three is still exact.
    assert!(checkpoint.integer_types_differ(&shaped));
    assert!(!checkpoint.integer_types_differ(&shaped[..1]));
    let integers = checkpoint
        .integer_stacked(&shaped)
        .expect("readable")
        .expect("every part is an integer type");
    let dense = checkpoint
        .stacked(&shaped, DType::F32, None, RowOrder::AsStored)
        .expect("readable")
        .try_to_vec::<f32>()
        .expect("f32");

    assert_eq!(integers.dims, [16, COLS]);
    assert_eq!(integers.block, 16);
    let offsets = integers
        .offsets
        .as_ref()
        .expect("Q4_K and Q4_1 have offsets")
        .borrowed();
    let scales = integers.scales.borrowed();
    assert!(dense.iter().any(|&w| w != 0.0));
    let IntegerValues::Bytes(values) = &integers.values else {
        panic!("a checkpoint gives one byte per value");
    };
    for (i, (&q, &want)) in values.iter().zip(&dense).enumerate() {
        let b = i / integers.block;
        let got = scales.get(b) * f32::from(q) + offsets.get(b);
        assert_eq!(got, want, "row {}, column {}", i / COLS, i % COLS);
    }

    // A Q6_K tensor alone is split straight into six bits, which widen to the same weights.
    let key = &shaped[1..2];
    let six_bits = checkpoint
        .integer_stacked(key)
        .expect("readable")
        .expect("Q6_K is an integer type");
    assert!(matches!(
        six_bits.values,
        IntegerValues::SixBits { zero: 32, .. }
    ));
    let dense_key = checkpoint
        .stacked(key, DType::F32, None, RowOrder::AsStored)
        .expect("readable")
        .try_to_vec::<f32>()
        .expect("f32");
    let mut widened = vec![f32::NAN; dense_key.len()];
    six_bits.rows().widen(0, &mut widened);
    assert_eq!(widened, dense_key);

    // Float parts are not integers: the stack is declined, not approximated.
    let float = Builder::default()
        .f32_tensor(
            "blk.0.attn_q.weight",
            &[COLS as u64, 8],
            &vec![0.5; 8 * COLS],
        )
        .build();
    let checkpoint = GgufCheckpoint::new(
        GgufFile::from_bytes("f.gguf", float).unwrap(),
        Some(HEAD_DIM),
    );
    let query = [(TensorRole::Layer(0, LayerRole::Query), vec![8, COLS])];
    assert!(checkpoint.integer_stacked(&query).unwrap().is_none());
}

#[test]
fn a_tensor_of_one_type_is_held_in_its_own_bits_and_factors() {
    // Each alone, as a file stores a projection: the query's rows reordered within heads.
    // The 4- and 5-bit types are held in their bits as stored (Q4_0's and Q5_0's signed
    // values shifted by 8 and 16), Q6_K in six bits, Q8_0 in bytes; the K types keep their
    // super-block's base and each block's step as the file holds them, the others their f16
    // scales.
    enum Held {
        Nibbles(u8),
        FiveBits(u8),
        SixBits,
        Bytes,
    }
    for (ty, scale_at, held, per) in [
        (GgmlType::Q4_0, vec![0], Held::Nibbles(8), None),
        (GgmlType::Q4_1, vec![0, 2], Held::Nibbles(0), None),
        (GgmlType::Q5_0, vec![0], Held::FiveBits(16), None),
        (GgmlType::Q5_1, vec![0, 2], Held::FiveBits(0), None),
        (GgmlType::Q8_0, vec![0], Held::Bytes, None),
        (GgmlType::Q4_K, vec![0, 2], Held::Nibbles(0), Some(8)),
        (GgmlType::Q5_K, vec![0, 2], Held::FiveBits(0), Some(8)),
        (GgmlType::Q6_K, vec![208], Held::SixBits, Some(16)),
    ] {
        let data = blocks(ty, 8, &scale_at, 7);
        let bytes = Builder::default()
            .tensor("blk.0.attn_q.weight", &[COLS as u64, 8], ty.id(), data)
            .build();
        let file = GgufFile::from_bytes("one.gguf", bytes).expect("a valid file");
        let checkpoint = GgufCheckpoint::new(file, Some(HEAD_DIM));
        let query = [(TensorRole::Layer(0, LayerRole::Query), vec![8, COLS])];
        let integers = checkpoint
            .integer_stacked(&query)
            .expect("readable")
            .expect("an integer type");
        match (&integers.values, held) {
            (IntegerValues::Nibbles { zero, .. }, Held::Nibbles(held)) => assert_eq!(*zero, held),
            (IntegerValues::FiveBits { zero, .. }, Held::FiveBits(held)) => {
                assert_eq!(*zero, held)
            }
            (IntegerValues::SixBits { zero: 32, .. }, Held::SixBits) => {}
            (IntegerValues::Bytes(_), Held::Bytes) => {}
            _ => panic!("{ty:?} is held in another form"),
        }
        // The others' f16 scales (and minimums) stay f16.
        match (&integers.scales, per) {
            (BlockFactors::Scaled { per: held, .. }, Some(per)) => assert_eq!(*held, per),
            (BlockFactors::F16(_), None) => {}
            _ => panic!("{ty:?}'s scales are held in another form"),
        }
        let dense = checkpoint
            .stacked(&query, DType::F32, None, RowOrder::AsStored)
            .expect("readable")
            .try_to_vec::<f32>()
            .expect("f32");
        assert!(dense.iter().any(|&w| w != 0.0));
        let mut widened = vec![f32::NAN; dense.len()];
        integers.rows().widen(0, &mut widened);
        assert_eq!(widened, dense, "{ty:?}");
    }
}
