//! ggml tensor types: their block layouts, their split into integers, scales and offsets
//! (what the CPU kernels multiply), and exact scalar dequantization to `f32`.
//!
//! The parser must know the byte size of *every* type ggml defines, not only the ones smolchat
//! can compute with: a tensor's size is what lets us check that it lies inside the file, and a
//! file with one exotic tensor should still open, list its metadata, and fail only when that
//! tensor is used, with an error naming it. Ids ggml has retired (4, 5, 31–33, 36–38) or not
//! yet assigned (43 and up, as of ggml's `GGML_TYPE_COUNT` = 43) are refused at parse time
//! because nothing can size them.
//!
//! The layouts follow `ggml-common.h`; the arithmetic follows `dequantize_row_*` in
//! `ggml-quants.c` operation for operation (same products in the same order, no fused
//! multiply-add), so results are bit-identical to ggml's reference CPU path. Dequantization
//! is the parts of [`split_row`] multiplied out; it loads weights for the GPU and checks the
//! kernels.
//!
//! All multi-byte fields are little-endian and read with `from_le_bytes`, so nothing here
//! depends on the slice's alignment (an owned `Vec<u8>` gives no alignment guarantee).

use half::{bf16, f16};

/// Elements per block of the k-quants (`QK_K` in ggml).
const QK_K: usize = 256;

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $block:expr, $bytes:expr; )*) => {
        /// A tensor element type, as numbered in ggml's `enum ggml_type`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType { $( $variant, )* }

        impl GgmlType {
            /// Every type ggml currently defines, in id order.
            pub const ALL: &[GgmlType] = &[ $( GgmlType::$variant, )* ];

            /// The type with this ggml id; `None` for ids ggml retired or never assigned.
            pub fn from_id(id: u32) -> Option<Self> {
                match id { $( $id => Some(Self::$variant), )* _ => None }
            }

            /// The ggml type id, as stored in a GGUF tensor info.
            pub fn id(self) -> u32 {
                match self { $( Self::$variant => $id, )* }
            }

            /// ggml's name for the type (`"Q4_K"`, `"IQ2_XXS"`), for messages.
            pub fn name(self) -> &'static str {
                match self { $( Self::$variant => $name, )* }
            }

            /// Elements per block; a row's length must be a multiple of it.
            pub fn block_size(self) -> usize {
                match self { $( Self::$variant => $block, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self { $( Self::$variant => $bytes, )* }
            }
        }
    };
}

// Sizes are the `sizeof(block_*)` of ggml-common.h: f16 scales are 2 bytes, `QK_K` = 256.
ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 2 + 16;
    Q4_1 = 3, "Q4_1", 32, 2 + 2 + 16;
    Q5_0 = 6, "Q5_0", 32, 2 + 4 + 16;
    Q5_1 = 7, "Q5_1", 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, "Q8_0", 32, 2 + 32;
    Q8_1 = 9, "Q8_1", 32, 2 + 2 + 32;
    Q2_K = 10, "Q2_K", QK_K, QK_K / 16 + QK_K / 4 + 2 + 2;
    Q3_K = 11, "Q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2;
    Q4_K = 12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2;
    Q5_K = 13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2;
    Q6_K = 14, "Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    Q8_K = 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2;
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 2 + QK_K / 8 * 2;
    IQ2_XS = 17, "IQ2_XS", QK_K, 2 + QK_K / 8 * 2 + QK_K / 32;
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 2 + 3 * QK_K / 8;
    IQ1_S = 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 32 * 2;
    IQ4_NL = 20, "IQ4_NL", 32, 2 + 16;
    IQ3_S = 21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64;
    IQ2_S = 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 32;
    IQ4_XS = 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 64 + QK_K / 2;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", QK_K, (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + 2;
    TQ2_0 = 35, "TQ2_0", QK_K, QK_K / 4 + 2;
    MXFP4 = 39, "MXFP4", 32, 1 + 16;
    NVFP4 = 40, "NVFP4", 64, 64 / 16 + 64 / 2;
    Q1_0 = 41, "Q1_0", 128, 2 + 128 / 8;
    Q2_0 = 42, "Q2_0", 64, 2 + 64 / 4;
}

impl GgmlType {
    /// Whether [`dequantize_row`] handles this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K
        )
    }

    /// Bytes taken by `n_elements` elements, or `None` if `n_elements` is not a whole number
    /// of blocks or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a row could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    #[error("type {} cannot be dequantized", .0.name())]
    Unsupported(GgmlType),
    #[error("{ty}: {n_out} outputs is not a whole number of {}-element blocks", ty.block_size())]
    PartialBlock { ty: GgmlType, n_out: usize },
    #[error("{ty}: {n_out} outputs need {expected} input bytes, got {got}")]
    LengthMismatch {
        ty: GgmlType,
        n_out: usize,
        expected: usize,
        got: usize,
    },
}

/// Dequantizes `out.len()` elements of type `ty` from `bytes` into `out`.
///
/// `bytes` must hold exactly the blocks for `out.len()` elements (a whole row, or any whole
/// number of blocks). Types outside [`GgmlType::can_dequantize`] give
/// [`DequantError::Unsupported`]; callers that know the tensor name should say which tensor.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    check_lengths(ty, bytes, out.len())?;
    let blocks = bytes
        .chunks_exact(ty.type_size())
        .zip(out.chunks_exact_mut(ty.block_size()));
    match ty {
        GgmlType::F32 => blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes(le4(b, 0))),
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => blocks.for_each(|(b, y)| y[0] = bf16::from_bits(u16_at(b, 0)).to_f32()),
        _ => {
            let sub = ty.integer_block().ok_or(DequantError::Unsupported(ty))?;
            let (mut q, mut scales, mut offsets) = ([0i8; QK_K], [0f32; QK_K], [0f32; QK_K]);
            let per_block = ty.block_size() / sub;
            for (b, y) in blocks {
                split_block(
                    ty,
                    b,
                    IntegerParts {
                        q: &mut q[..y.len()],
                        scales: &mut scales[..per_block],
                        offsets: &mut offsets[..per_block],
                    },
                );
                // ggml's own order: `scale · q`, then `+ offset` only for the types that have
                // one (adding a zero would turn a -0.0 into +0.0).
                for ((y, q), (&scale, &offset)) in y
                    .chunks_exact_mut(sub)
                    .zip(q.chunks_exact(sub))
                    .zip(scales.iter().zip(&offsets))
                {
                    for (y, &q) in y.iter_mut().zip(q) {
                        *y = scale * f32::from(q);
                        if ty.has_offsets() {
                            *y += offset;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// A row of an integer type as the CPU kernels multiply it: element `i` is
/// `scales[i / sub] · q[i] + offsets[i / sub]`, where `sub` is [`GgmlType::integer_block`].
pub struct IntegerParts<'a> {
    pub q: &'a mut [i8],
    pub scales: &'a mut [f32],
    /// Zeros for the types without offsets.
    pub offsets: &'a mut [f32],
}

/// Splits a row of an integer type (see [`GgmlType::integer_block`]) into its parts, exactly:
/// `dequantize_row` is these parts multiplied out.
pub fn split_row(ty: GgmlType, bytes: &[u8], parts: IntegerParts<'_>) -> Result<(), DequantError> {
    let n_out = parts.q.len();
    check_lengths(ty, bytes, n_out)?;
    let sub = ty.integer_block().ok_or(DequantError::Unsupported(ty))?;
    if parts.scales.len() * sub != n_out || parts.offsets.len() != parts.scales.len() {
        return Err(DequantError::PartialBlock { ty, n_out });
    }
    let per_block = ty.block_size() / sub;
    let blocks = bytes
        .chunks_exact(ty.type_size())
        .zip(parts.q.chunks_exact_mut(ty.block_size()))
        .zip(parts.scales.chunks_exact_mut(per_block))
        .zip(parts.offsets.chunks_exact_mut(per_block));
    for (((b, q), scales), offsets) in blocks {
        split_block(ty, b, IntegerParts { q, scales, offsets });
    }
    Ok(())
}

/// A Q4_0, Q4_1 or Q4_K row's 4-bit values as Q4_0 lays them out, unsigned as stored (Q4_0
/// means them less 8): per block of 32, byte `i` holds value `i` in its low half and value
/// `i + 16` in its high one. Q4_0 and Q4_1 blocks hold them so, and Q4_K's 64-value chunks hold
/// one block in the low halves of 32 bytes and the next in the high ones. The loader keeps
/// them so without splitting them into bytes (see `IntegerValues::Nibbles`).
pub fn nibbles_row(ty: GgmlType, bytes: &[u8], nibbles: &mut [u8]) -> Result<(), DequantError> {
    let values = nibbles.len() * 2;
    check_lengths(ty, bytes, values)?;
    let blocks = bytes.chunks_exact(ty.type_size());
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let at = if ty == GgmlType::Q4_0 { 2 } else { 4 };
            for (b, out) in blocks.zip(nibbles.chunks_exact_mut(16)) {
                out.copy_from_slice(&b[at..at + 16]);
            }
        }
        GgmlType::Q4_K => {
            for (b, out) in blocks.zip(nibbles.chunks_exact_mut(256 / 2)) {
                k_nibbles(&b[16..144], out);
            }
        }
        _ => return Err(DequantError::Unsupported(ty)),
    }
    Ok(())
}

/// A K type's 128 bytes of nibbles (per 64-value chunk, one block of 32 in the low halves of
/// 32 bytes and the next in the high ones) as Q4_0 lays out its blocks.
fn k_nibbles(qs: &[u8], out: &mut [u8]) {
    for (q, out) in qs.chunks_exact(32).zip(out.chunks_exact_mut(32)) {
        let (first, second) = out.split_at_mut(16);
        for (i, (first, second)) in first.iter_mut().zip(second).enumerate() {
            let (low, high) = (q[i], q[i + 16]);
            *first = (low & 0x0F) | (high << 4);
            *second = (low >> 4) | (high & 0xF0);
        }
    }
}

/// A Q5_0, Q5_1 or Q5_K row's 5-bit values as stored, unsigned (Q5_0 means them less 16):
/// their low four bits as [`nibbles_row`] lays out 4-bit ones, and each block of 32's fifth
/// bits in one word, bit `j` for value `j` (as Q5_0 and Q5_1 store them; Q5_K holds bit `s`
/// of byte `l` for value `l` of sub-block `s`). The loader keeps them so without splitting
/// them into bytes (see `IntegerValues::FiveBits`).
pub fn five_bits_row(
    ty: GgmlType,
    bytes: &[u8],
    nibbles: &mut [u8],
    high: &mut [u32],
) -> Result<(), DequantError> {
    let values = nibbles.len() * 2;
    check_lengths(ty, bytes, values)?;
    if high.len() * 32 != values {
        return Err(DequantError::PartialBlock { ty, n_out: values });
    }
    let blocks = bytes.chunks_exact(ty.type_size());
    match ty {
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let at = if ty == GgmlType::Q5_0 { 2 } else { 4 };
            let outs = nibbles.chunks_exact_mut(16).zip(high.iter_mut());
            for (b, (out, word)) in blocks.zip(outs) {
                *word = u32::from_le_bytes(le4(b, at));
                out.copy_from_slice(&b[at + 4..at + 20]);
            }
        }
        GgmlType::Q5_K => {
            let outs = nibbles
                .chunks_exact_mut(256 / 2)
                .zip(high.chunks_exact_mut(8));
            for (b, (out, words)) in blocks.zip(outs) {
                let qh = &b[16..48];
                for (s, word) in words.iter_mut().enumerate() {
                    *word = qh
                        .iter()
                        .enumerate()
                        .fold(0, |word, (l, &bits)| word | u32::from((bits >> s) & 1) << l);
                }
                k_nibbles(&b[48..176], out);
            }
        }
        _ => return Err(DequantError::Unsupported(ty)),
    }
    Ok(())
}

/// The f16 block scales, and minimums where it has them, of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0
/// as the row stores them: [`split_row`]'s factors, exactly.
pub fn half_factors(
    ty: GgmlType,
    bytes: &[u8],
    scales: &mut [f16],
    offsets: Option<&mut [f16]>,
) -> Result<(), DequantError> {
    use GgmlType::*;
    let blocks = bytes.len() / ty.type_size();
    let fits = |factors: &[f16]| factors.len() == blocks;
    if !matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0) {
        return Err(DequantError::Unsupported(ty));
    }
    if !bytes.len().is_multiple_of(ty.type_size())
        || !fits(scales)
        || offsets.as_deref().is_some_and(|offsets| !fits(offsets))
        || offsets.is_some() != ty.has_offsets()
    {
        return Err(DequantError::PartialBlock {
            ty,
            n_out: scales.len() * ty.block_size(),
        });
    }
    let stored = bytes.chunks_exact(ty.type_size());
    for (b, scale) in stored.clone().zip(scales.iter_mut()) {
        *scale = f16::from_bits(u16_at(b, 0));
    }
    for (b, offset) in stored.zip(offsets.into_iter().flatten()) {
        *offset = f16::from_bits(u16_at(b, 2));
    }
    Ok(())
}

/// A K type's block factors (Q4_K, Q5_K, Q6_K) as its file holds them: per super-block of
/// 256 values a base (`d`, and `dmin` for the offsets), per block the small integer that
/// multiplies it. Scale `b` of [`split_row`]'s row is `scales.0[b / per] · scales.1[b]` and
/// offset `b` is `offsets.0[b / per] · offsets.1[b]`, exactly, `per` being the blocks of a
/// super-block: the loader keeps that form rather than searching the f32 factors for a
/// common base, which was a quarter of loading a 1.7B Q4_K_M file.
pub struct KFactors<'a> {
    pub scales: (&'a mut [f16], &'a mut [i8]),
    /// `None` for Q6_K, which has no offsets.
    pub offsets: Option<(&'a mut [f16], &'a mut [i8])>,
}

/// Writes a row's [`KFactors`]; an error for other types and for parts of another length.
pub fn k_factors(ty: GgmlType, bytes: &[u8], out: &mut KFactors<'_>) -> Result<(), DequantError> {
    let supers = bytes.len() / ty.type_size();
    let blocks = supers * ty.block_size() / ty.integer_block().unwrap_or(1);
    let lengths_fit =
        |(bases, steps): &(&mut [f16], &mut [i8])| bases.len() == supers && steps.len() == blocks;
    let k4 = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K);
    if !(k4 || ty == GgmlType::Q6_K) {
        return Err(DequantError::Unsupported(ty));
    }
    if !bytes.len().is_multiple_of(ty.type_size())
        || !lengths_fit(&out.scales)
        || out
            .offsets
            .as_ref()
            .is_some_and(|offsets| !lengths_fit(offsets))
        || out.offsets.is_some() != k4
    {
        return Err(DequantError::PartialBlock {
            ty,
            n_out: out.scales.1.len(),
        });
    }
    let (bases, steps) = &mut out.scales;
    let per = blocks / supers.max(1);
    for (s, b) in bytes.chunks_exact(ty.type_size()).enumerate() {
        let group = s * per..(s + 1) * per;
        match &mut out.offsets {
            // Q6_K: `d` after the values and the 8-bit scales.
            None => {
                bases[s] = f16::from_bits(u16_at(b, 208));
                for (step, &scale) in steps[group].iter_mut().zip(&b[192..208]) {
                    *step = scale as i8;
                }
            }
            // Q4_K and Q5_K: `d`, `dmin`, then the 6-bit scales and minimums; −dmin · min
            // as dmin · (−min), the sign exact either way.
            Some((offset_bases, offset_steps)) => {
                bases[s] = f16::from_bits(u16_at(b, 0));
                offset_bases[s] = f16::from_bits(u16_at(b, 2));
                let pairs = steps[group.clone()]
                    .iter_mut()
                    .zip(&mut offset_steps[group]);
                for (j, (step, offset_step)) in pairs.enumerate() {
                    let (scale, min) = scale_min_k4(j, &b[4..16]);
                    (*step, *offset_step) = (scale as i8, -(min as i8));
                }
            }
        }
    }
    Ok(())
}

impl GgmlType {
    /// Elements per scale when the type stores small integers (at most 8 bits) times a scale,
    /// plus an offset, per sub-block: the form the CPU kernels multiply without widening.
    /// `None` for the float types.
    pub fn integer_block(self) -> Option<usize> {
        use GgmlType::*;
        match self {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K => Some(32),
            Q6_K => Some(16),
            _ => None,
        }
    }

    /// Whether the type's sub-blocks have an offset (a minimum) besides their scale.
    pub fn has_offsets(self) -> bool {
        use GgmlType::*;
        matches!(self, Q4_1 | Q5_1 | Q4_K | Q5_K)
    }
}

fn check_lengths(ty: GgmlType, bytes: &[u8], n_out: usize) -> Result<(), DequantError> {
    if !ty.can_dequantize() {
        return Err(DequantError::Unsupported(ty));
    }
    let expected = ty
        .bytes_for(n_out as u64)
        .ok_or(DequantError::PartialBlock { ty, n_out })? as usize;
    if bytes.len() != expected {
        return Err(DequantError::LengthMismatch {
            ty,
            n_out,
            expected,
            got: bytes.len(),
        });
    }
    Ok(())
}

/// One block of an integer type; `parts` hold exactly one block.
fn split_block(ty: GgmlType, b: &[u8], parts: IntegerParts<'_>) {
    match ty {
        GgmlType::Q4_0 => split_q4_0(b, parts),
        GgmlType::Q4_1 => split_q4_1(b, parts),
        GgmlType::Q5_0 => split_q5_0(b, parts),
        GgmlType::Q5_1 => split_q5_1(b, parts),
        GgmlType::Q8_0 => split_q8_0(b, parts),
        GgmlType::Q4_K => split_q4_k(b, parts),
        GgmlType::Q5_K => split_q5_k(b, parts),
        GgmlType::Q6_K => split_q6_k(b, parts),
        _ => unreachable!("{ty} has no integer_block()"),
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le4(b: &[u8], at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16_at(b, at)).to_f32()
}

/// Small unsigned values less `zero`, as the kernels' signed integers.
fn centred(value: u8, zero: u8) -> i8 {
    (i16::from(value) - i16::from(zero)) as i8
}

// block_q4_0 { f16 d; u8 qs[16] }: element j is the low nibble of qs[j], element j+16 the high
// nibble, both offset by 8.
fn split_q4_0(b: &[u8], p: IntegerParts<'_>) {
    (p.scales[0], p.offsets[0]) = (f16_at(b, 0), 0.0);
    for (j, &q) in b[2..18].iter().enumerate() {
        p.q[j] = centred(q & 0x0F, 8);
        p.q[j + 16] = centred(q >> 4, 8);
    }
}

// block_q4_1 { f16 d; f16 m; u8 qs[16] }: as Q4_0 but unsigned nibbles plus a minimum.
fn split_q4_1(b: &[u8], p: IntegerParts<'_>) {
    (p.scales[0], p.offsets[0]) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        p.q[j] = centred(q & 0x0F, 0);
        p.q[j + 16] = centred(q >> 4, 0);
    }
}

// block_q5_0 { f16 d; u8 qh[4]; u8 qs[16] }: bit j of qh is the fifth bit of element j.
fn split_q5_0(b: &[u8], p: IntegerParts<'_>) {
    (p.scales[0], p.offsets[0]) = (f16_at(b, 0), 0.0);
    split_q5(u32::from_le_bytes(le4(b, 2)), &b[6..22], 16, p.q);
}

// block_q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16] }
fn split_q5_1(b: &[u8], p: IntegerParts<'_>) {
    (p.scales[0], p.offsets[0]) = (f16_at(b, 0), f16_at(b, 2));
    split_q5(u32::from_le_bytes(le4(b, 4)), &b[8..24], 0, p.q);
}

/// The 32 values of a Q5_0/Q5_1 block less `zero`: element j (j < 16) is the low nibble of
/// qs[j] and bit j of qh, element j + 16 the high nibble and bit j + 16.
fn split_q5(qh: u32, qs: &[u8], zero: u8, q: &mut [i8]) {
    for (j, &byte) in qs.iter().enumerate() {
        let fifth = |bit: usize| (((qh >> bit) & 1) as u8) << 4;
        q[j] = centred((byte & 0x0F) | fifth(j), zero);
        q[j + 16] = centred((byte >> 4) | fifth(j + 16), zero);
    }
}

// block_q8_0 { f16 d; i8 qs[32] }
fn split_q8_0(b: &[u8], p: IntegerParts<'_>) {
    (p.scales[0], p.offsets[0]) = (f16_at(b, 0), 0.0);
    for (q, &byte) in p.q.iter_mut().zip(&b[2..34]) {
        *q = byte as i8;
    }
}

/// Scale and minimum of sub-block `j` (0..8) of a Q4_K/Q5_K block, packed as 6-bit values in
/// 12 bytes (ggml's `get_scale_min_k4`): sub-blocks 0–3 use the low 6 bits of bytes 0–3 and
/// 4–7; sub-blocks 4–7 take their low 4 bits from bytes 8–11 and their top 2 bits from the
/// spare top bits of bytes 0–7.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The eight sub-blocks' scales `d · scale` and offsets `−dmin · min` of a Q4_K/Q5_K block.
fn scales_k4(b: &[u8], p: &mut IntegerParts<'_>) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..8 {
        let (scale, min) = scale_min_k4(j, &b[4..16]);
        p.scales[j] = d * f32::from(scale);
        p.offsets[j] = -(dmin * f32::from(min));
    }
}

// block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: four 64-element chunks; in chunk
// c, elements 0..32 are the low nibbles of qs[32c..32c+32] (sub-block 2c), elements 32..64 the
// high nibbles (sub-block 2c+1).
fn split_q4_k(b: &[u8], mut p: IntegerParts<'_>) {
    scales_k4(b, &mut p);
    for (qs, q) in b[16..144].chunks_exact(32).zip(p.q.chunks_exact_mut(64)) {
        for (l, &byte) in qs.iter().enumerate() {
            q[l] = centred(byte & 0x0F, 0);
            q[l + 32] = centred(byte >> 4, 0);
        }
    }
}

// block_q5_K { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }: as Q4_K, with the
// fifth bit of element l of sub-block s in bit s of qh[l].
fn split_q5_k(b: &[u8], mut p: IntegerParts<'_>) {
    scales_k4(b, &mut p);
    let qh = &b[16..48];
    for (c, (qs, q)) in b[48..176]
        .chunks_exact(32)
        .zip(p.q.chunks_exact_mut(64))
        .enumerate()
    {
        for (l, &byte) in qs.iter().enumerate() {
            let fifth = |sub: usize| ((qh[l] >> sub) & 1) << 4;
            q[l] = centred((byte & 0x0F) | fifth(2 * c), 0);
            q[l + 32] = centred((byte >> 4) | fifth(2 * c + 1), 0);
        }
    }
}

// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: two 128-element halves; in a
// half, element 32g + l (g = 0..4) takes its low 4 bits from ql[l + 32(g&1)] (low nibble for
// g < 2, high for g >= 2), its top 2 bits from bits 2g..2g+2 of qh[l], and scale l/16 + 2g of
// its half: element i of the block has scale i / 16.
fn split_q6_k(b: &[u8], p: IntegerParts<'_>) {
    let d = f16_at(b, 208);
    for (s, (scale, offset)) in p.scales.iter_mut().zip(p.offsets.iter_mut()).enumerate() {
        *scale = d * f32::from(b[192 + s] as i8);
        *offset = 0.0;
    }
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let q = &mut p.q[128 * half..128 * half + 128];
        for l in 0..32 {
            let low = [ql[l] & 0x0F, ql[l + 32] & 0x0F, ql[l] >> 4, ql[l + 32] >> 4];
            for (g, low) in low.into_iter().enumerate() {
                q[32 * g + l] = centred(low | (((qh[l] >> (2 * g)) & 3) << 4), 32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each test builds blocks from chosen scales and quantized values with an *encoder* that
    //! states the layout element by element, then checks the decoder's output against
    //! `scale * q (+/- min)` computed from those same chosen values.
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    fn dequant(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
        let n = bytes.len() / ty.type_size() * ty.block_size();
        let mut out = vec![f32::NAN; n];
        dequantize_row(ty, bytes, &mut out).unwrap();
        out
    }

    #[test]
    fn block_sizes_match_ggml() {
        use GgmlType::*;
        let expected = [
            (Q4_0, 18),
            (Q4_1, 20),
            (Q5_0, 22),
            (Q5_1, 24),
            (Q8_0, 34),
            (Q8_1, 36),
            (Q2_K, 84),
            (Q3_K, 110),
            (Q4_K, 144),
            (Q5_K, 176),
            (Q6_K, 210),
            (Q8_K, 292),
            (IQ2_XXS, 66),
            (IQ2_XS, 74),
            (IQ3_XXS, 98),
            (IQ1_S, 50),
            (IQ4_NL, 18),
            (IQ3_S, 110),
            (IQ2_S, 82),
            (IQ4_XS, 136),
            (IQ1_M, 56),
            (TQ1_0, 54),
            (TQ2_0, 66),
            (MXFP4, 17),
            (NVFP4, 36),
            (Q1_0, 18),
            (Q2_0, 18),
        ];
        for (ty, size) in expected {
            assert_eq!(ty.type_size(), size, "{ty}");
        }
        for &ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
        }
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(retired), None, "id {retired}");
        }
    }

    #[test]
    fn plain_floats() {
        let xs = [1.5f32, -0.0, f32::INFINITY, 3.0e-5];
        let f32_bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(dequant(GgmlType::F32, &f32_bytes), xs);
        let f16b: Vec<u8> = [1.5f32, -2.0, 65504.0]
            .iter()
            .flat_map(|&x| f16_bytes(x))
            .collect();
        assert_eq!(dequant(GgmlType::F16, &f16b), [1.5, -2.0, 65504.0]);
        // bf16 is the top half of an f32: 0x3FC0 = 1.5, 0xC000 = -2.0, 0x4049 = 3.140625.
        let bf: Vec<u8> = [0x3FC0u16, 0xC000, 0x4049]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(dequant(GgmlType::BF16, &bf), [1.5, -2.0, 3.140625]);
    }

    #[test]
    fn q8_0() {
        let mut b = f16_bytes(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = dequant(GgmlType::Q8_0, &b);
        let want: Vec<f32> = (0..32).map(|i| (i - 16) as f32 * 0.5).collect();
        assert_eq!(y, want);
    }

    /// Packs 32 4-bit values: element j in the low nibble of byte j, element j+16 in the high.
    fn pack_nibbles(q: &[u8; 32]) -> [u8; 16] {
        std::array::from_fn(|j| q[j] | (q[j + 16] << 4))
    }

    #[test]
    fn q4_0_and_q4_1() {
        let q: [u8; 32] = std::array::from_fn(|i| (i * 7 % 16) as u8);
        let mut b0 = f16_bytes(0.25).to_vec();
        b0.extend(pack_nibbles(&q));
        let want0: Vec<f32> = q.iter().map(|&v| (v as f32 - 8.0) * 0.25).collect();
        assert_eq!(dequant(GgmlType::Q4_0, &b0), want0);

        let mut b1 = f16_bytes(0.125).to_vec();
        b1.extend(f16_bytes(-1.0));
        b1.extend(pack_nibbles(&q));
        let want1: Vec<f32> = q.iter().map(|&v| v as f32 * 0.125 - 1.0).collect();
        assert_eq!(dequant(GgmlType::Q4_1, &b1), want1);
        // Two blocks in a row decode independently.
        let two = [b1.clone(), b1].concat();
        assert_eq!(
            dequant(GgmlType::Q4_1, &two),
            [want1.clone(), want1].concat()
        );
    }

    /// Packs 32 5-bit values as Q5 stores them: low nibbles like Q4, fifth bits in a u32.
    fn pack_q5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
        let lows: [u8; 32] = std::array::from_fn(|i| q[i] & 0x0F);
        let qh: u32 = (0..32).map(|i| ((q[i] >> 4) as u32 & 1) << i).sum();
        (qh.to_le_bytes(), pack_nibbles(&lows))
    }

    #[test]
    fn q5_0_and_q5_1() {
        let q: [u8; 32] = std::array::from_fn(|i| (i * 11 % 32) as u8);
        let (qh, qs) = pack_q5(&q);
        let mut b0 = f16_bytes(2.0).to_vec();
        b0.extend(qh);
        b0.extend(qs);
        let want0: Vec<f32> = q.iter().map(|&v| (v as f32 - 16.0) * 2.0).collect();
        assert_eq!(dequant(GgmlType::Q5_0, &b0), want0);

        let mut b1 = f16_bytes(0.5).to_vec();
        b1.extend(f16_bytes(3.0));
        b1.extend(qh);
        b1.extend(qs);
        let want1: Vec<f32> = q.iter().map(|&v| v as f32 * 0.5 + 3.0).collect();
        assert_eq!(dequant(GgmlType::Q5_1, &b1), want1);
    }

    /// Packs eight 6-bit (scale, min) pairs the way `get_scale_min_k4` unpacks them.
    fn pack_scale_min_k4(sm: &[(u8, u8); 8]) -> [u8; 12] {
        let mut p = [0u8; 12];
        for (j, &(s, m)) in sm.iter().enumerate() {
            if j < 4 {
                p[j] |= s & 63;
                p[j + 4] |= m & 63;
            } else {
                p[j + 4] |= (s & 0x0F) | ((m & 0x0F) << 4);
                p[j - 4] |= (s >> 4) << 6;
                p[j] |= (m >> 4) << 6;
            }
        }
        p
    }

    /// Sub-block scales and mins that exercise all six bits, and one value per element.
    fn k_fixture(bits: u32) -> ([(u8, u8); 8], [u8; 256]) {
        let sm: [(u8, u8); 8] =
            std::array::from_fn(|j| ((j * 9 + 1) as u8 % 64, (63 - j * 5) as u8));
        let q: [u8; 256] = std::array::from_fn(|i| ((i * 13 + i / 7) % (1 << bits)) as u8);
        (sm, q)
    }

    /// Every element of a Q4_K/Q5_K block: `d · scale · q − dmin · min` of its 32-wide group.
    fn assert_scale_min_block(y: &[f32], sm: &[(u8, u8)], q: &[u8], d: f32, dmin: f32) {
        for i in 0..256 {
            let (s, m) = sm[i / 32];
            let want = d * s as f32 * q[i] as f32 - dmin * m as f32;
            assert_eq!(y[i], want, "element {i}");
        }
    }

    #[test]
    fn q4_k() {
        let (sm, q) = k_fixture(4);
        let (d, dmin) = (0.5f32, 0.25f32);
        let mut qs = [0u8; 128];
        for (i, &v) in q.iter().enumerate() {
            let (chunk, k) = (i / 64, i % 64);
            qs[chunk * 32 + k % 32] |= v << (4 * (k / 32));
        }
        let mut b = [f16_bytes(d), f16_bytes(dmin)].concat();
        b.extend(pack_scale_min_k4(&sm));
        b.extend(qs);
        let y = dequant(GgmlType::Q4_K, &b);
        assert_scale_min_block(&y, &sm, &q, d, dmin);
    }

    #[test]
    fn q5_k() {
        let (sm, q) = k_fixture(5);
        let (d, dmin) = (0.125f32, 1.5f32);
        let mut qs = [0u8; 128];
        let mut qh = [0u8; 32];
        for (i, &v) in q.iter().enumerate() {
            let (chunk, k) = (i / 64, i % 64);
            qs[chunk * 32 + k % 32] |= (v & 0x0F) << (4 * (k / 32));
            qh[k % 32] |= (v >> 4) << (i / 32);
        }
        let mut b = [f16_bytes(d), f16_bytes(dmin)].concat();
        b.extend(pack_scale_min_k4(&sm));
        b.extend(qh);
        b.extend(qs);
        let y = dequant(GgmlType::Q5_K, &b);
        assert_scale_min_block(&y, &sm, &q, d, dmin);
    }

    #[test]
    fn q6_k() {
        let q: [u8; 256] = std::array::from_fn(|i| ((i * 29 + 3) % 64) as u8);
        let scales: [i8; 16] = std::array::from_fn(|j| (j as i8 - 8) * 15);
        let d = 0.0625f32;
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for (i, &v) in q.iter().enumerate() {
            let (half, r) = (i / 128, i % 128);
            let (g, l) = (r / 32, r % 32);
            ql[64 * half + l + 32 * (g & 1)] |= (v & 0x0F) << (4 * (g / 2));
            qh[32 * half + l] |= (v >> 4) << (2 * g);
        }
        let mut b = ql.to_vec();
        b.extend(qh);
        b.extend(scales.map(|s| s as u8));
        b.extend(f16_bytes(d));
        let y = dequant(GgmlType::Q6_K, &b);
        for i in 0..256 {
            let (half, r) = (i / 128, i % 128);
            let sc = scales[8 * half + (r % 32) / 16 + 2 * (r / 32)];
            let want = d * sc as f32 * (q[i] as i32 - 32) as f32;
            assert_eq!(y[i], want, "element {i}");
        }
    }

    #[test]
    fn wrong_lengths_and_unsupported_types_are_errors() {
        let mut out = [0f32; 32];
        assert_eq!(
            dequantize_row(GgmlType::Q4_1, &[0; 19], &mut out),
            Err(DequantError::LengthMismatch {
                ty: GgmlType::Q4_1,
                n_out: 32,
                expected: 20,
                got: 19
            })
        );
        assert_eq!(
            dequantize_row(GgmlType::Q4_K, &[0; 144], &mut out),
            Err(DequantError::PartialBlock {
                ty: GgmlType::Q4_K,
                n_out: 32
            })
        );
        let err = dequantize_row(GgmlType::IQ2_XXS, &[0; 66], &mut [0f32; 256]).unwrap_err();
        assert_eq!(err.to_string(), "type IQ2_XXS cannot be dequantized");
    }
}
