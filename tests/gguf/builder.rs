//! Shared by the integration tests: where the real files are, and a writer for hand-built GGUF
//! images (so each parser check states exactly which bytes it feeds in).

use std::path::{Path, PathBuf};

/// Fetched by `.ci/setup` (through `.ci/fetch-model.sh`); a test that needs it fails when it is
/// missing, since a skipped check looks the same as a passed one.
pub fn real_model() -> PathBuf {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run `bash .ci/setup` (it fetches the genuine SmolLM2-135M-Instruct GGUF)",
        path.display()
    );
    path
}

/// The model's own `tokenizer.json`, the reference the GGUF tokenizer must match.
pub fn reference_tokenizer_json() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/smollm2-135m-instruct/tokenizer.json")
}

/// llama.cpp's vocabulary test files, fetched by `.ci/setup` (`.ci/fetch-vocab-tests.sh`).
pub fn vocab_test_dir() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/llama.cpp-vocab");
    assert!(
        path.join("ggml-vocab-llama-bpe.gguf").is_file(),
        "{} has no vocabulary files: run `bash .ci/setup`",
        path.display()
    );
    path
}

/// A metadata value to write, by GGUF type.
#[derive(Clone, Debug)]
pub enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id and the elements (each written without its own type tag).
    Arr(u32, Vec<V>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl V {
    pub fn type_id(&self) -> u32 {
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::Str(_) => 8,
            V::Arr(..) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
        }
    }

    pub fn str(s: &str) -> V {
        V::Str(s.to_owned())
    }

    pub fn strs(items: &[&str]) -> V {
        V::Arr(8, items.iter().map(|s| V::str(s)).collect())
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            V::U8(v) => out.push(*v),
            V::I8(v) => out.push(*v as u8),
            V::U16(v) => out.extend(v.to_le_bytes()),
            V::I16(v) => out.extend(v.to_le_bytes()),
            V::U32(v) => out.extend(v.to_le_bytes()),
            V::I32(v) => out.extend(v.to_le_bytes()),
            V::F32(v) => out.extend(v.to_le_bytes()),
            V::Bool(v) => out.push(*v as u8),
            V::Str(s) => write_str(out, s),
            V::Arr(elem, items) => {
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.write(out);
                }
            }
            V::U64(v) => out.extend(v.to_le_bytes()),
            V::I64(v) => out.extend(v.to_le_bytes()),
            V::F64(v) => out.extend(v.to_le_bytes()),
        }
    }
}

pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A tensor to write: name, ggml dims, ggml type id, and its data bytes.
#[derive(Clone, Debug)]
pub struct T {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// Writes a GGUF image. Tensor data is laid out in order, each padded to `alignment`, exactly
/// as llama.cpp's writer does; `offset_override` lets a test lie about one tensor's offset.
#[derive(Clone, Debug)]
pub struct Builder {
    pub version: u32,
    pub kvs: Vec<(String, V)>,
    pub tensors: Vec<T>,
    pub alignment: u64,
    pub offset_override: Option<(usize, u64)>,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
            offset_override: None,
        }
    }
}

impl Builder {
    pub fn kv(mut self, key: &str, v: V) -> Self {
        if let ("general.alignment", V::U32(a)) = (key, &v) {
            self.alignment = *a as u64;
        }
        self.kvs.push((key.to_owned(), v));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(T {
            name: name.to_owned(),
            dims: dims.to_vec(),
            type_id,
            data,
        });
        self
    }

    /// An F32 tensor holding `values`, with ggml dims `dims`.
    pub fn f32_tensor(self, name: &str, dims: &[u64], values: &[f32]) -> Self {
        self.tensor(
            name,
            dims,
            0,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            write_str(&mut out, k);
            out.extend(v.type_id().to_le_bytes());
            v.write(&mut out);
        }
        let align = self.alignment.max(1);
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (i, t) in self.tensors.iter().enumerate() {
            write_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            let written = match self.offset_override {
                Some((j, o)) if j == i => o,
                _ => offset,
            };
            out.extend(written.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(align);
        }
        if !self.tensors.is_empty() {
            out.resize((out.len() as u64).next_multiple_of(align) as usize, 0);
            let data_start = out.len();
            for (t, o) in self.tensors.iter().zip(offsets) {
                out.resize(data_start + o as usize, 0);
                out.extend(&t.data);
            }
        }
        out
    }
}
