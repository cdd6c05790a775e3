use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::GenerationError;
use super::memory_plan::{MemoryPlan, available_memory, gguf_model_config};
use crate::backend::{BackendKind, ComputeDevice};
use crate::gguf::{GgufFile, GgufTokenizer};
use crate::model::checkpoint::gguf::GgufCheckpoint;
use crate::model::{KvCache, Llama, LoadProgress, Precision};
use crate::model_files::{is_gguf, model_name, weight_bytes};
use crate::text::{ChatTemplate, SamplingDefaults, StopTokens, TextTokenizer};

/// How to load a model: where it runs and in which precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelOptions {
    pub backend: BackendKind,
    pub precision: Precision,
}

/// Everything generation needs from a model: the network, its tokenizer, its chat template
/// and the tokens that end a reply.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
    pub stop_tokens: StopTokens,
    /// The sampling its authors recommend, if they name any.
    pub sampling_defaults: SamplingDefaults,
    /// The model folder or GGUF file.
    pub dir: PathBuf,
    /// What the model runs on, which is not what was asked for when the GPU is unusable.
    pub device: ComputeDevice,
    /// The options in effect: the backend is the one that runs the model.
    pub options: ModelOptions,
    pub load_time: Duration,
    /// The integer types a GGUF file stores its weights in (`"Q4_1"`, `"Q5_0+Q8_0+Q4_K+Q6_K"`),
    /// if any.
    pub integer_types: Option<String>,
    /// The weights' and the KV cache's memory, and the context the model gets.
    pub memory: MemoryPlan,
}

impl LoadedModel {
    /// Loads a model folder (Hugging Face layout) or a `.gguf` file.
    pub fn load(path: &Path, options: ModelOptions) -> Result<Self, GenerationError> {
        Self::load_with_progress(path, options, &mut |_| {})
    }

    /// [`LoadedModel::load`], telling `progress` of each layer read: a 4B model takes
    /// seconds, which a bar makes bearable.
    pub fn load_with_progress(
        path: &Path,
        options: ModelOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, GenerationError> {
        let started = Instant::now();
        // Measured before the weights take their share of it.
        let available = available_memory();
        let device = ComputeDevice::open(options.backend);
        let parts = if is_gguf(path) {
            Parts::from_gguf(path, &device, options.precision, progress)?
        } else {
            Parts::from_folder(path, &device, options.precision, progress)?
        };
        // Reading a checkpoint allocates and frees far more than the model keeps (file
        // buffers, conversions): without this, that memory stayed resident for as long as
        // the model was loaded.
        crate::stats::memory::release_freed_heap();
        let memory = MemoryPlan::new(parts.model.config(), weight_bytes(path), available);
        Ok(Self {
            memory,
            integer_types: parts.integer_types,
            model: parts.model,
            tokenizer: parts.tokenizer,
            template: parts.template,
            stop_tokens: parts.stop_tokens,
            sampling_defaults: parts.sampling_defaults,
            dir: path.to_path_buf(),
            options: ModelOptions {
                backend: device.backend,
                ..options
            },
            device,
            load_time: started.elapsed(),
        })
    }

    /// An empty KV cache holding up to the context the model gets (see [`MemoryPlan`]).
    pub fn new_cache(&self) -> KvCache {
        self.model.new_cache().limited_to(self.memory.context)
    }

    /// A one-line description for the status bar and logs; for a file of integer weights,
    /// whether they run as stored or dequantized (on the GPU).
    pub fn describe(&self) -> String {
        let config = self.model.config();
        let mut line = format!(
            "{} · {} layers · {} context · {} on {}",
            model_name(&self.dir),
            config.num_hidden_layers,
            self.memory.context,
            self.options.precision,
            self.device.name()
        );
        if self.integer_types.is_some() {
            line = format!("{line} · {}", self.weights());
        }
        line
    }

    /// How the weights are held: the CPU keeps a GGUF file's integers as stored (see
    /// `Loader::integers`); the GPU dequantizes them at load to the compute type.
    pub fn weights(&self) -> String {
        let name = |dtype: burn::tensor::DType| format!("{dtype:?}").to_lowercase();
        match (&self.integer_types, self.options.backend) {
            (Some(types), BackendKind::Gpu) => {
                format!(
                    "{types} weights dequantized to {}",
                    name(self.model.dtype())
                )
            }
            (Some(types), _) => format!("{types} weights as stored"),
            (None, _) => {
                let held = self.model.weight_dtype().unwrap_or(self.model.dtype());
                format!("{} weights", name(held))
            }
        }
    }
}

/// What a model file or folder provides, whichever format it is in.
struct Parts {
    model: Llama,
    tokenizer: TextTokenizer,
    template: ChatTemplate,
    stop_tokens: StopTokens,
    sampling_defaults: SamplingDefaults,
    integer_types: Option<String>,
}

impl Parts {
    fn from_folder(
        dir: &Path,
        device: &ComputeDevice,
        precision: Precision,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, GenerationError> {
        let tokenizer = TextTokenizer::load(dir)?;
        let template = ChatTemplate::from_dir(dir)?;
        let model = Llama::load_in(dir, &device.device, precision, progress)?;
        let stop_tokens = StopTokens::from_dir(dir, &tokenizer)?;
        Ok(Self {
            model,
            tokenizer,
            template,
            stop_tokens,
            sampling_defaults: SamplingDefaults::from_dir(dir),
            integer_types: None,
        })
    }

    /// Everything from the one file: the config and tokenizer from its metadata, the chat
    /// template it carries, and the end-of-turn token it names.
    fn from_gguf(
        path: &Path,
        device: &ComputeDevice,
        precision: Precision,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, GenerationError> {
        let file = GgufFile::open(path)?;
        let config = gguf_model_config(&file)?;
        let vocabulary = GgufTokenizer::from_gguf(&file)?;
        let token_text = |id: Option<u32>| id.and_then(|id| vocabulary.tokenizer.id_to_token(id));
        let template = ChatTemplate::embedded(
            path,
            vocabulary.chat_template.as_deref(),
            token_text(vocabulary.bos_token_id).as_deref(),
            token_text(vocabulary.eos_token_id).as_deref(),
        )?;
        let stop_tokens = StopTokens::from_ids(vocabulary.eos_token_id.into_iter().collect());
        let tokenizer = TextTokenizer::from_parts(vocabulary.tokenizer, path.to_path_buf());
        let sampling_defaults = SamplingDefaults::from_gguf(file.metadata());
        let integer_types = integer_types(&file);
        let reordered_heads = config
            .architecture()?
            .gguf_reorders_qk()
            .then(|| config.head_dim());
        let checkpoint = GgufCheckpoint::new(file, reordered_heads);
        let model =
            Llama::from_checkpoint(config, &checkpoint, &device.device, precision, progress)?;
        Ok(Self {
            model,
            tokenizer,
            template,
            stop_tokens,
            sampling_defaults,
            integer_types,
        })
    }
}

/// The integer types among a file's tensors, in the order they first appear.
fn integer_types(file: &GgufFile) -> Option<String> {
    let mut types: Vec<&str> = Vec::new();
    for info in file.tensors() {
        let ty = info.ggml_type;
        if ty.integer_block().is_some() && !types.contains(&ty.name()) {
            types.push(ty.name());
        }
    }
    (!types.is_empty()).then(|| types.join("+"))
}
