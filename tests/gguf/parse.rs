//! The container parser on hand-built files: what it accepts, and the named error for each way
//! a file can be wrong.

use super::builder::{Builder, V};
use smolchat::gguf::{GgmlType, GgufErrorKind, GgufFile, MetadataArray, MetadataValue};

fn open(bytes: Vec<u8>) -> Result<GgufFile, smolchat::gguf::GgufError> {
    GgufFile::from_bytes("test.gguf", bytes)
}

fn kind(bytes: Vec<u8>) -> GgufErrorKind {
    open(bytes).expect_err("the file should be refused").kind
}

fn every_type() -> Builder {
    Builder::default()
        .kv("u8", V::U8(200))
        .kv("i8", V::I8(-100))
        .kv("u16", V::U16(60000))
        .kv("i16", V::I16(-30000))
        .kv("u32", V::U32(4_000_000_000))
        .kv("i32", V::I32(-7))
        .kv("f32", V::F32(1.5))
        .kv("bool", V::Bool(true))
        .kv("str", V::str("héllo"))
        .kv("u64", V::U64(u64::MAX))
        .kv("i64", V::I64(i64::MIN))
        .kv("f64", V::F64(0.1))
        .kv("strs", V::strs(&["a", "", "ü"]))
        .kv("f32s", V::Arr(6, vec![V::F32(1.0), V::F32(-2.5)]))
        .kv("i32s", V::Arr(5, vec![V::I32(-1), V::I32(3)]))
        .kv(
            "nested",
            V::Arr(
                9,
                vec![
                    V::Arr(4, vec![V::U32(1), V::U32(2)]),
                    V::Arr(8, vec![V::str("x")]),
                ],
            ),
        )
        .kv("empty", V::Arr(0, vec![]))
}

#[test]
fn reads_every_value_type() {
    for version in [2, 3] {
        let file = open(
            Builder {
                version,
                ..every_type()
            }
            .build(),
        )
        .unwrap();
        assert_eq!(file.version(), version);
        assert_eq!(file.metadata().len(), 17);
        assert_eq!(file.get_u32("u8").unwrap(), 200);
        assert_eq!(file.get_u32("u16").unwrap(), 60000);
        assert_eq!(file.get_u32("u32").unwrap(), 4_000_000_000);
        assert_eq!(file.metadata().get("i8"), Some(&MetadataValue::I8(-100)));
        assert_eq!(
            file.metadata().get("i16"),
            Some(&MetadataValue::I16(-30000))
        );
        assert_eq!(
            file.metadata().get("i64"),
            Some(&MetadataValue::I64(i64::MIN))
        );
        assert_eq!(file.get_f32("f32").unwrap(), 1.5);
        assert_eq!(file.get_f32("f64").unwrap(), 0.1f64 as f32);
        assert_eq!(file.get_bool_opt("bool").unwrap(), Some(true));
        assert_eq!(file.get_str("str").unwrap(), "héllo");
        assert_eq!(file.get_str_array("strs").unwrap(), ["a", "", "ü"]);
        assert_eq!(file.get_f32_array("f32s").unwrap(), [1.0, -2.5]);
        assert_eq!(file.get_i32_array("i32s").unwrap(), [-1, 3]);
        assert_eq!(
            file.metadata().get("nested"),
            Some(&MetadataValue::Array(MetadataArray::Array(vec![
                MetadataArray::U32(vec![1, 2]),
                MetadataArray::String(vec!["x".into()]),
            ])))
        );
        assert_eq!(
            file.metadata().get("empty"),
            Some(&MetadataValue::Array(MetadataArray::U8(vec![])))
        );
        assert_eq!(file.get_u32_opt("absent").unwrap(), None);
        let keys: Vec<&str> = file.metadata().iter().map(|(k, _)| k).collect();
        assert_eq!(keys[..3], ["u8", "i8", "u16"], "file order is kept");
    }
}

#[test]
fn typed_getters_name_the_key_and_the_types() {
    let file = open(every_type().build()).unwrap();
    let err = file.get_u32("nope").unwrap_err();
    assert!(matches!(&err.kind, GgufErrorKind::MissingKey { key } if key == "nope"));
    assert_eq!(
        err.to_string(),
        "GGUF file test.gguf: metadata key \"nope\" is missing"
    );

    let err = file.get_u32("str").unwrap_err();
    match &err.kind {
        GgufErrorKind::WrongType {
            key,
            expected,
            found,
        } => {
            assert_eq!(
                (key.as_str(), *expected, found.as_str()),
                ("str", "u32", "string")
            );
        }
        other => panic!("{other:?}"),
    }
    let err = file.get_str_array("f32s").unwrap_err();
    assert!(
        err.to_string()
            .contains("\"f32s\" is array<f32>, expected array<string>"),
        "{err}"
    );
    // An integer of the wrong width is accepted when it fits and refused by value when not.
    assert!(matches!(
        file.get_u32("i32").unwrap_err().kind,
        GgufErrorKind::InvalidValue { .. }
    ));
    assert!(matches!(
        file.get_u32("u64").unwrap_err().kind,
        GgufErrorKind::InvalidValue { .. }
    ));
    assert!(matches!(
        file.get_f32("u32").unwrap_err().kind,
        GgufErrorKind::WrongType { .. }
    ));
}

#[test]
fn tensors_are_slices_of_the_file_at_their_alignment() {
    let values: Vec<f32> = (0..6).map(|i| i as f32).collect();
    for alignment in [32u32, 64, 1] {
        let b = Builder::default()
            .kv("general.alignment", V::U32(alignment))
            .f32_tensor("a", &[3, 2], &values)
            .f32_tensor("b", &[5], &[9.0; 5])
            .tensor("q", &[32], GgmlType::Q8_0.id(), {
                let mut block = half::f16::from_f32(0.5).to_le_bytes().to_vec();
                block.extend((0..32).map(|i| i as u8));
                block
            });
        let file = open(b.build()).unwrap();
        assert_eq!(file.alignment(), alignment as u64);
        assert_eq!(file.data_offset() % alignment as u64, 0);
        let a = file.tensor("a").unwrap();
        assert_eq!(
            (a.info.row_len(), a.info.n_rows(), a.info.shape()),
            (3, 2, vec![2, 3])
        );
        assert_eq!(a.to_f32_vec().unwrap(), values);
        let mut row = [0f32; 3];
        a.dequantize_row(1, &mut row).unwrap();
        assert_eq!(row, [3.0, 4.0, 5.0]);
        assert!(a.dequantize_row(2, &mut row).is_err(), "row out of range");
        assert_eq!(file.tensor("b").unwrap().to_f32_vec().unwrap(), [9.0; 5]);
        let q = file.tensor("q").unwrap().to_f32_vec().unwrap();
        assert_eq!(q[31], 15.5);
        assert_eq!(file.tensor_info("b").unwrap().offset % alignment as u64, 0);
    }
}

#[test]
fn a_tensor_of_a_type_we_cannot_compute_opens_but_refuses_by_name() {
    let ty = GgmlType::IQ2_XXS;
    let file = open(
        Builder::default()
            .tensor("blk.0.ffn_up.weight", &[256, 2], ty.id(), vec![0; 2 * 66])
            .build(),
    )
    .unwrap();
    let err = file
        .tensor("blk.0.ffn_up.weight")
        .unwrap()
        .to_f32_vec()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "GGUF file test.gguf: tensor \"blk.0.ffn_up.weight\" has type IQ2_XXS, which cannot be dequantized"
    );
    let err = file.tensor("output.weight").unwrap_err();
    assert!(matches!(err.kind, GgufErrorKind::MissingTensor { .. }));
}

#[test]
fn structural_errors() {
    assert!(matches!(
        kind(b"GGML\x03\0\0\0".to_vec()),
        GgufErrorKind::BadMagic { .. }
    ));
    assert!(matches!(
        kind(b"GG".to_vec()),
        GgufErrorKind::Truncated { .. }
    ));
    assert!(matches!(
        kind(
            Builder {
                version: 1,
                ..Builder::default()
            }
            .build()
        ),
        GgufErrorKind::UnsupportedVersion { version: 1 }
    ));
    assert!(matches!(
        kind(
            Builder {
                version: 4,
                ..Builder::default()
            }
            .build()
        ),
        GgufErrorKind::UnsupportedVersion { version: 4 }
    ));
    let mut be = Builder::default().build();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(kind(be), GgufErrorKind::BigEndian { .. }));
}

#[test]
fn lying_counts_and_lengths_are_refused_before_allocating() {
    let base = Builder::default().kv("k", V::str("value")).build();
    // Tensor count and metadata count (offsets 8 and 16).
    for at in [8, 16] {
        let mut b = base.clone();
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(
            matches!(
                kind(b),
                GgufErrorKind::CountTooLarge {
                    count: u64::MAX,
                    ..
                }
            ),
            "count at {at}"
        );
    }
    // The key's length (offset 24), then the value string's length (after key, type).
    let value_len_at = 24 + 8 + 1 + 4;
    for at in [24, value_len_at] {
        let mut b = base.clone();
        b[at..at + 8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        assert!(
            matches!(kind(b), GgufErrorKind::Truncated { .. }),
            "length at {at}"
        );
    }
    // An array whose element count is a lie.
    let mut arr = Builder::default()
        .kv("a", V::Arr(6, vec![V::F32(1.0)]))
        .build();
    let count_at = 24 + 8 + 1 + 4 + 4;
    arr[count_at..count_at + 8].copy_from_slice(&(1u64 << 61).to_le_bytes());
    match kind(arr) {
        GgufErrorKind::CountTooLarge {
            what,
            count,
            min_entry_bytes: 4,
            ..
        } => {
            assert_eq!(count, 1 << 61);
            assert!(what.contains("\"a\""), "{what}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_metadata() {
    assert!(matches!(
        kind(Builder::default().kv("k", V::U8(1)).kv("k", V::U8(2)).build()),
        GgufErrorKind::DuplicateKey { key } if key == "k"
    ));
    let mut unknown = Builder::default().kv("k", V::U8(1)).build();
    unknown[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(matches!(
        kind(unknown),
        GgufErrorKind::UnknownValueType { type_id: 13, .. }
    ));
    let mut bad_utf8 = Builder::default().kv("k", V::str("ab")).build();
    let len = bad_utf8.len();
    bad_utf8[len - 1] = 0xFF;
    assert!(matches!(kind(bad_utf8), GgufErrorKind::InvalidUtf8 { .. }));
    let mut deep = V::Arr(0, vec![]);
    for _ in 0..20 {
        deep = V::Arr(9, vec![deep]);
    }
    assert!(matches!(
        kind(Builder::default().kv("deep", deep).build()),
        GgufErrorKind::NestingTooDeep { .. }
    ));
    for bad in [0, 3, 48] {
        let b = Builder::default()
            .kv("general.alignment", V::U32(bad))
            .build();
        assert!(
            matches!(kind(b), GgufErrorKind::InvalidValue { .. }),
            "alignment {bad}"
        );
    }
    let b = Builder::default()
        .kv("general.alignment", V::str("32"))
        .build();
    assert!(matches!(kind(b), GgufErrorKind::WrongType { .. }));
}

#[test]
fn bad_tensor_infos() {
    let one = |dims: &[u64], type_id: u32, data: Vec<u8>| {
        Builder::default().tensor("t", dims, type_id, data)
    };
    assert!(matches!(
        kind(one(&[1, 1, 1, 1, 1], 0, vec![0; 4]).build()),
        GgufErrorKind::TooManyDims { n_dims: 5, .. }
    ));
    assert!(matches!(
        kind(one(&[1 << 32, 1 << 32], 0, vec![]).build()),
        GgufErrorKind::DimsOverflow { .. }
    ));
    assert!(matches!(
        kind(one(&[u64::MAX], 0, vec![]).build()),
        GgufErrorKind::DimsOverflow { .. }
    ));
    // A zero dimension makes the element count 0, but the row count must not overflow either.
    assert!(matches!(
        kind(one(&[0, 1 << 40, 1 << 40], 0, vec![]).build()),
        GgufErrorKind::DimsOverflow { .. }
    ));
    let empty = open(one(&[0, 3], 0, vec![]).build()).unwrap();
    assert!(empty.tensor("t").unwrap().to_f32_vec().unwrap().is_empty());
    for retired in [4, 5, 31, 99] {
        match kind(one(&[32], retired, vec![0; 18]).build()) {
            GgufErrorKind::UnknownGgmlType { tensor, type_id } => {
                assert_eq!((tensor.as_str(), type_id), ("t", retired))
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(
        kind(one(&[16, 2], GgmlType::Q4_0.id(), vec![0; 18]).build()),
        GgufErrorKind::PartialBlock {
            row_len: 16,
            block_size: 32,
            ..
        }
    ));
    // Data that ends past the end of the file.
    let mut short = one(&[8], 0, vec![0; 32]).build();
    short.truncate(short.len() - 1);
    assert!(matches!(
        kind(short),
        GgufErrorKind::TensorOutOfBounds { .. }
    ));
    let far = Builder {
        offset_override: Some((0, u64::MAX - 31)),
        ..one(&[8], 0, vec![0; 32])
    };
    assert!(matches!(
        kind(far.build()),
        GgufErrorKind::TensorOutOfBounds { .. }
    ));
    let misaligned = Builder {
        offset_override: Some((0, 4)),
        ..one(&[8], 0, vec![0; 32])
    };
    assert!(matches!(
        kind(misaligned.build()),
        GgufErrorKind::MisalignedTensor {
            offset: 4,
            alignment: 32,
            ..
        }
    ));
    let dup = one(&[1], 0, vec![0; 4]).f32_tensor("t", &[1], &[1.0]);
    assert!(
        matches!(kind(dup.build()), GgufErrorKind::DuplicateTensor { tensor } if tensor == "t")
    );
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let full = every_type().f32_tensor("w", &[4, 2], &[1.0; 8]).build();
    assert!(open(full.clone()).is_ok());
    for len in 0..full.len() {
        let err = open(full[..len].to_vec()).expect_err(&format!("truncated to {len}"));
        assert!(
            matches!(
                err.kind,
                GgufErrorKind::Truncated { .. }
                    | GgufErrorKind::CountTooLarge { .. }
                    | GgufErrorKind::TensorOutOfBounds { .. }
            ),
            "truncated to {len}: {err}"
        );
    }
}

#[test]
fn errors_name_the_path() {
    let err = GgufFile::open("/nonexistent/model.gguf").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("GGUF file /nonexistent/model.gguf: cannot read the file"),
        "{err}"
    );
    let err = GgufFile::from_bytes("/models/x.gguf", b"GGUF\x03\0\0\0".to_vec()).unwrap_err();
    assert_eq!(err.path, std::path::Path::new("/models/x.gguf"));
    assert!(
        err.to_string()
            .contains("the tensor count needs 8 bytes at offset 8, but only 0 remain"),
        "{err}"
    );
}

#[test]
fn an_empty_file_on_disk_is_truncated_not_an_io_error() {
    let path = std::env::temp_dir().join(format!("gguf-empty-{}.gguf", std::process::id()));
    std::fs::write(&path, b"").unwrap();
    let err = GgufFile::open(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(err.kind, GgufErrorKind::Truncated { .. }), "{err}");
}
