//! A GGUF file's float weights as the model holds them: a part stored in the type it is held
//! in is copied bit for bit, rows in Hugging Face order, and a part held in another type is
//! converted to the same values.

use burn::tensor::DType;
use half::bf16;
use smolchat::gguf::{GgmlType, GgufFile};
use smolchat::model::checkpoint::gguf::GgufCheckpoint;
use smolchat::model::checkpoint::{Checkpoint, LayerRole, RowOrder, TensorRole};

use super::builder::Builder;

const COLS: usize = 64;
const ROWS: usize = 8;
const HEAD_DIM: usize = 4;

#[test]
fn bf16_parts_are_held_as_stored_and_widen_to_the_f32_stack() {
    // Distinct values per row, so that a row out of place shows; one of them a signalling
    // NaN, whose payload survives a copy but not a round trip through f32.
    let signalling_nan = 0x7F81;
    let bits: Vec<u16> = (0..ROWS * COLS)
        .map(|i| match i {
            5 => signalling_nan,
            _ => bf16::from_f32((i as f32 - 100.0) / 64.0).to_bits(),
        })
        .collect();
    let data: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let file = Builder::default()
        .tensor(
            "blk.0.attn_q.weight",
            &[COLS as u64, ROWS as u64],
            GgmlType::BF16.id(),
            data.clone(),
        )
        .tensor(
            "blk.0.attn_k.weight",
            &[COLS as u64, ROWS as u64],
            GgmlType::BF16.id(),
            data,
        )
        .build();
    let checkpoint = GgufCheckpoint::new(
        GgufFile::from_bytes("bf16.gguf", file).expect("a valid file"),
        Some(HEAD_DIM),
    );
    let parts: Vec<(TensorRole, Vec<usize>)> = [LayerRole::Query, LayerRole::Key]
        .into_iter()
        .map(|role| (TensorRole::Layer(0, role), vec![ROWS, COLS]))
        .collect();

    let held = checkpoint
        .stacked(&parts, DType::BF16, None, RowOrder::AsStored)
        .expect("readable")
        .try_to_vec::<bf16>()
        .expect("bf16");
    let widened = checkpoint
        .stacked(&parts, DType::F32, None, RowOrder::AsStored)
        .expect("readable")
        .try_to_vec::<f32>()
        .expect("f32");

    assert_eq!(held.len(), 2 * ROWS * COLS);
    // Every stored value is there, the NaN's bits included.
    let mut held_bits: Vec<u16> = held[..ROWS * COLS].iter().map(|v| v.to_bits()).collect();
    let mut stored = bits.clone();
    held_bits.sort_unstable();
    stored.sort_unstable();
    assert_eq!(held_bits, stored);
    // Rows in the order the f32 stack puts them (the query's reordered within its heads).
    for (i, (&h, &w)) in held.iter().zip(&widened).enumerate() {
        if w.is_nan() {
            assert!(h.is_nan(), "value {i}");
        } else {
            assert_eq!(h.to_f32(), w, "row {}, column {}", i / COLS, i % COLS);
        }
    }
    // The query's rows did move, or the check above would not tell orders apart.
    let in_file_order = held[..ROWS * COLS]
        .iter()
        .zip(&bits)
        .all(|(h, &b)| h.to_bits() == b);
    assert!(!in_file_order);

    // Laid out by lane as it is decoded: per group of sixteen rows, lane by lane (a column's
    // place in its sixteen), each lane's columns in order, a column's sixteen rows side by side.
    let by_lane = checkpoint
        .stacked(&parts, DType::F32, None, RowOrder::ByLane)
        .expect("readable")
        .try_to_vec::<f32>()
        .expect("f32");
    for (i, &w) in widened.iter().enumerate() {
        let (row, col) = (i / COLS, i % COLS);
        let column = col % 16 * (COLS / 16) + col / 16;
        let at = row / 16 * 16 * COLS + column * 16 + row % 16;
        assert_eq!(
            by_lane[at].to_bits(),
            w.to_bits(),
            "row {row}, column {col}"
        );
    }
}
