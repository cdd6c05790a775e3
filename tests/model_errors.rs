//! Broken model folders give errors that name the file, tensor or value, and never panic.

use crate::common;

use std::path::Path;

use burn::tensor::DType;
use common::tiny_model_copy;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use smolchat::backend::BackendKind;
use smolchat::model::checkpoint::{LayerRole, TensorRole};
use smolchat::model::{Llama, ModelConfig, ModelError};
use smolchat::model_files::SINGLE_WEIGHTS_FILE;

fn load(dir: &Path) -> Result<Llama, ModelError> {
    Llama::load(dir, &common::device(BackendKind::Flex), DType::F32)
}

/// Rewrites the fixture's weights through `edit`, which may drop or replace tensors.
fn rewrite_weights(
    dir: &Path,
    edit: impl Fn(&str, TensorView) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let path = dir.join(SINGLE_WEIGHTS_FILE);
    let bytes = std::fs::read(&path).expect("read weights");
    let file = SafeTensors::deserialize(&bytes).expect("parse weights");
    let tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            edit(&name, view).map(|(dtype, shape, data)| (name, dtype, shape, data))
        })
        .collect();
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.as_str(),
                TensorView::new(*dtype, shape.clone(), data).expect("view"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).expect("write weights");
}

fn keep(view: TensorView) -> Option<(Dtype, Vec<usize>, Vec<u8>)> {
    Some((view.dtype(), view.shape().to_vec(), view.data().to_vec()))
}

fn edit_config(dir: &Path, field: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    config[field] = value;
    std::fs::write(&path, config.to_string()).expect("write config");
}

#[test]
fn missing_folder_names_the_config_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("no-such-model");
    let err = load(&missing).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains(&missing.join("config.json").display().to_string()),
        "{err}"
    );
}

#[test]
fn missing_weights_file_is_named() {
    let dir = tiny_model_copy();
    std::fs::remove_file(dir.path().join(SINGLE_WEIGHTS_FILE)).expect("remove");
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(err.contains(SINGLE_WEIGHTS_FILE), "{err}");
}

#[test]
fn truncated_weights_are_reported_as_corrupt() {
    let dir = tiny_model_copy();
    let path = dir.path().join(SINGLE_WEIGHTS_FILE);
    let bytes = std::fs::read(&path).expect("read");
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).expect("truncate");
    let err = load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::CorruptWeights { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn corrupt_header_is_reported_as_corrupt() {
    for garbage in [
        &b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": broken}"[..],
        &b"\x01\x02"[..],
        &[0xff; 64][..],
    ] {
        let dir = tiny_model_copy();
        std::fs::write(dir.path().join(SINGLE_WEIGHTS_FILE), garbage).expect("write garbage");
        let err = load(dir.path()).unwrap_err();
        assert!(matches!(err, ModelError::CorruptWeights { .. }), "{err:?}");
    }
}

#[test]
fn missing_tensor_is_named() {
    let dir = tiny_model_copy();
    let missing = LayerRole::Up.safetensors_name(1);
    rewrite_weights(dir.path(), |name, view| {
        (name != missing).then(|| keep(view)).flatten()
    });
    let err = load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
    assert!(err.to_string().contains(&missing), "{err}");
}

#[test]
fn wrong_shape_names_tensor_expected_and_found() {
    let dir = tiny_model_copy();
    let keys = LayerRole::Key.safetensors_name(0);
    rewrite_weights(dir.path(), |name, view| {
        if name == keys {
            Some((view.dtype(), vec![64, 32], view.data().to_vec()))
        } else {
            keep(view)
        }
    });
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(err.contains(&keys), "{err}");
    assert!(
        err.contains("[64, 32]") && err.contains("[32, 64]"),
        "{err}"
    );
}

#[test]
fn unsupported_dtype_is_named() {
    let dir = tiny_model_copy();
    let norm = TensorRole::FinalNorm.safetensors_name();
    rewrite_weights(dir.path(), |name, view| {
        if name == norm {
            Some((Dtype::I16, view.shape().to_vec(), view.data().to_vec()))
        } else {
            keep(view)
        }
    });
    let err = load(dir.path()).unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedDtype { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&norm) && message.contains("I16"),
        "{message}"
    );
}

#[test]
fn config_with_other_hidden_size_than_weights_is_a_shape_error() {
    let dir = tiny_model_copy();
    edit_config(dir.path(), "hidden_size", 128.into());
    let err = load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::WrongShape { .. }), "{err:?}");
}

#[test]
fn config_with_fewer_layers_than_weights_is_refused() {
    let dir = tiny_model_copy();
    edit_config(dir.path(), "num_hidden_layers", 1.into());
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("num_hidden_layers = 1"), "{err}");
}

#[test]
fn config_with_more_layers_than_weights_names_the_missing_tensor() {
    let dir = tiny_model_copy();
    edit_config(dir.path(), "num_hidden_layers", 3.into());
    let err = load(dir.path()).unwrap_err().to_string();
    let config = ModelConfig::from_file(&dir.path().join("config.json")).expect("config");
    let family = config.family().expect("family");
    assert!(
        LayerRole::all(&family)
            .iter()
            .any(|role| err.contains(&role.safetensors_name(2))),
        "{err}"
    );
}

#[test]
fn untied_config_without_lm_head_names_it() {
    let dir = tiny_model_copy();
    edit_config(dir.path(), "tie_word_embeddings", false.into());
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains(&TensorRole::LmHead.safetensors_name()),
        "{err}"
    );
}

#[test]
fn bad_tokens_are_errors_not_panics() {
    let model = load(&common::tiny_model_dir()).expect("fixture loads");
    let mut cache = model.new_cache();
    let err = model
        .forward(&[], &mut cache, smolchat::model::Logits::Last)
        .unwrap_err();
    assert!(matches!(err, ModelError::EmptyInput), "{err:?}");
    let err = model
        .forward(&[49152], &mut cache, smolchat::model::Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(err.contains("49152"), "{err}");
    assert_eq!(cache.len(), 0);
}
