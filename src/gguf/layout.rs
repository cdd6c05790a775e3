//! Undoing the row order llama.cpp's converter gives the Q and K projections.
//!
//! Hugging Face Llama checkpoints apply RoPE "rotate-half" style: coordinate `i` of a head is
//! rotated together with coordinate `i + head_dim/2`. llama.cpp rotates adjacent pairs
//! (`2i`, `2i + 1`), so `convert_hf_to_gguf.py` reorders the output rows of `q_proj` and
//! `k_proj` per head (`reshape(n_head, 2, head_dim/2, in).swapaxes(1, 2)`): GGUF row
//! `head·head_dim + 2i + a` holds Hugging Face row `head·head_dim + a·head_dim/2 + i`.
//!
//! A model written for Hugging Face's layout (as smolchat's is) must put the rows back, or
//! attention silently scores the wrong coordinate pairs. Only `attn_q` and `attn_k` are
//! affected; `attn_v`, `attn_output` and the MLP are stored as in the checkpoint. For K the
//! head count is the KV head count, but only `head_dim` matters: the reorder is within a head.

/// The GGUF row that holds Hugging Face row `hf_row` of a Q or K projection.
pub fn qk_gguf_row(hf_row: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (head, within) = (hf_row / head_dim, hf_row % head_dim);
    let (a, i) = (within / half, within % half);
    head * head_dim + 2 * i + a
}

/// Rows of a Q or K projection in Hugging Face order, from the GGUF order. `rows` holds
/// whole rows of `row_len` elements (any element type: dequantized floats, or raw blocks if
/// `row_len` counts bytes); the row count must be a multiple of the even `head_dim`.
pub fn unpermute_qk_rows<T: Copy>(rows: &[T], row_len: usize, head_dim: usize) -> Vec<T> {
    assert!(
        head_dim >= 2 && head_dim.is_multiple_of(2),
        "head_dim {head_dim} must be even"
    );
    assert!(
        row_len > 0 && rows.len().is_multiple_of(row_len * head_dim),
        "rows must be whole heads"
    );
    let n_rows = rows.len() / row_len;
    let mut out = Vec::with_capacity(rows.len());
    for hf_row in 0..n_rows {
        let src = qk_gguf_row(hf_row, head_dim) * row_len;
        out.extend_from_slice(&rows[src..src + row_len]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's permutation, transcribed from its numpy: view the rows of each head as
    /// `[2][head_dim/2]`, swap the two axes, flatten.
    fn convert_permute(rows: &[u32], head_dim: usize) -> Vec<u32> {
        let half = head_dim / 2;
        let mut out = vec![0; rows.len()];
        for (r, &v) in rows.iter().enumerate() {
            let (head, within) = (r / head_dim, r % head_dim);
            let (a, i) = (within / half, within % half); // HF index [a][i]
            out[head * head_dim + i * 2 + a] = v; // GGUF index [i][a]
        }
        out
    }

    #[test]
    fn inverts_the_converter() {
        for (heads, head_dim) in [(1, 2), (3, 64), (9, 64), (2, 8)] {
            let hf: Vec<u32> = (0..(heads * head_dim) as u32).collect();
            let gguf = convert_permute(&hf, head_dim);
            assert_eq!(unpermute_qk_rows(&gguf, 1, head_dim), hf);
        }
        // One head of 8: GGUF rows are HF rows 0,4,1,5,2,6,3,7; HF order reads GGUF rows
        // 0,2,4,6 then 1,3,5,7.
        assert_eq!(
            convert_permute(&[0, 1, 2, 3, 4, 5, 6, 7], 8),
            [0, 4, 1, 5, 2, 6, 3, 7]
        );
        assert_eq!(
            (0..8).map(|r| qk_gguf_row(r, 8)).collect::<Vec<_>>(),
            [0, 2, 4, 6, 1, 3, 5, 7]
        );
        // Rows wider than one element move whole.
        assert_eq!(
            unpermute_qk_rows(&[0, 0, 1, 1, 2, 2, 3, 3], 2, 4),
            [0, 0, 2, 2, 1, 1, 3, 3]
        );
    }
}
