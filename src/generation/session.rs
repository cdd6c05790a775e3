use std::ops::ControlFlow;
use std::time::Instant;

use super::error::GenerationError;
use super::loaded_model::LoadedModel;
use super::stats::GenerationStats;
use crate::backend::BackendKind;
use burn::tensor::Tensor;

use crate::model::{KvCache, Logits, ModelError, logits_to_vec, top_entries};
use crate::text::{Sampler, SamplingParams, StreamDecoder, TopLogits, log_softmax_top};

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced one of its end-of-reply tokens.
    StopToken,
    /// The requested number of new tokens was reached.
    MaxTokens,
    /// The context window is full; nothing more fits.
    ContextFull,
    /// The user pressed Stop.
    Stopped,
}

/// One generated token, as the chat view and the token-probability view need it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub id: u32,
    /// New text this token completes; empty while a multi-byte character is still partial.
    pub text: String,
    /// Probability of this token in the distribution it was drawn from (after temperature
    /// and the top-k/top-p/min-p filters); for greedy decoding, its softmax probability at
    /// temperature 1. See [`crate::text::SampledToken`].
    pub probability: f32,
    /// The likeliest tokens of that same distribution, with their text and probability.
    pub alternatives: Vec<(u32, String, f32)>,
    /// Only when the session was asked for them ([`GenerationSession::with_logprobs`]).
    pub logprobs: Option<TokenLogprobs>,
}

/// Log-probabilities under the model's own distribution: log-softmax of the raw logits at
/// temperature 1, before the repetition penalty and the sampling filters (unlike
/// [`TokenEvent::probability`]). What OpenAI's `logprobs` and reference comparisons need.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The generated token's own text (where [`TokenEvent::text`] may hold a partial
    /// character back, this never does).
    pub text: String,
    /// The generated token's.
    pub logprob: f32,
    /// The likeliest tokens, best first, with their text: as many as were asked for.
    pub top: Vec<(u32, String, f32)>,
}

/// What one call to [`GenerationSession::step`] produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Token(TokenEvent),
    /// Generation is over; `text` is whatever the detokenizer still held back.
    Finished {
        reason: FinishReason,
        text: String,
    },
}

/// What the last model step says about the next token.
#[allow(
    clippy::large_enum_variant,
    reason = "one per session, replaced each step: boxing would allocate per token"
)]
enum Prediction {
    /// The whole row of logits, read back: what log-probabilities and a repetition penalty
    /// need, and what the CPU backends hold anyway.
    Logits(Vec<f32>),
    /// On a GPU, the likeliest tokens and the weight of all of them, read back instead of the
    /// vocabulary; the row stays on the device for the rare step they cannot decide.
    Top { top: TopLogits, row: Tensor<2> },
}

/// A long prompt is read this many tokens at a time, so that reading it can report how far
/// it has come and stop between passes. Each pass is a place the KV cache can be reused back
/// to (`KvCache::reusable_prefix`), so a prompt sent again is read in the same passes and
/// gives the same logits. A pass of 256 rows keeps the prompt kernels' tiles full.
pub const PROMPT_CHUNK: usize = 256;

/// The shortest history read in passes of its own (see [`CheckedPrompt::with_history`]): a
/// pass costs a read of every weight, and the prompt kernels run at full speed from 16 rows.
pub const SHARED_HISTORY: usize = 16;

/// How far reading a prompt has come: `done` of its `total` tokens are in the KV cache, those
/// reused from the cache included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptProgress {
    pub done: usize,
    pub total: usize,
}

/// How many of the likeliest tokens a GPU step reads back: enough for the usual nucleus, a
/// fraction of the vocabulary's bytes.
const TOP_TOKENS_READ: usize = 64;

/// A prompt that fits a context, and a sampler made from valid settings: what
/// [`GenerationSession::begin_checked`] starts from.
pub struct CheckedPrompt {
    prompt: Vec<u32>,
    sampler: Sampler,
    /// See [`CheckedPrompt::with_history`].
    history: usize,
}

impl CheckedPrompt {
    /// Refuses an empty prompt, one that leaves no room in a context of `limit` tokens, and
    /// sampling settings the sampler does not take.
    pub fn new(
        prompt: Vec<u32>,
        limit: usize,
        params: &SamplingParams,
    ) -> Result<Self, GenerationError> {
        if prompt.is_empty() {
            return Err(GenerationError::EmptyPrompt);
        }
        if prompt.len() >= limit {
            return Err(GenerationError::PromptTooLong {
                prompt: prompt.len(),
                limit,
            });
        }
        Ok(Self {
            prompt,
            sampler: Sampler::new(params.clone())?,
            history: 0,
        })
    }

    /// Reads the first `history` tokens (what renders the conversation before its last
    /// message's text, `FittedPrompt::history`) in passes of their own, when they are at least
    /// [`SHARED_HISTORY`]: a later prompt with the same history and another last message then
    /// reuses them from the cache and reads on where its own reading would begin a pass, so
    /// that it answers bit for bit as if it were read whole.
    pub fn with_history(mut self, history: usize) -> Self {
        self.history = history;
        self
    }

    pub fn tokens(&self) -> &[u32] {
        &self.prompt
    }
}

/// A generation in progress: the prompt is read in passes, then each [`step`](Self::step)
/// samples one token and runs it through the model ([`choose`](Self::choose) then
/// [`predict_together`] for several sessions at once).
///
/// Nothing runs between passes and steps, so a caller cancels by simply not calling them
/// again (and reporting [`FinishReason::Stopped`]). The KV cache is borrowed, not owned: it outlives the
/// session, so the next turn of a conversation prefills only its new tokens.
pub struct GenerationSession<'a> {
    loaded: &'a LoadedModel,
    cache: &'a mut KvCache,
    sampler: Sampler,
    decoder: StreamDecoder<'a>,
    /// The whole prompt; the cache holds its first `cache.len()` tokens while it is read.
    prompt: Vec<u32>,
    /// What the model predicts after the last cached token, once the prompt is read.
    next: Prediction,
    max_new_tokens: usize,
    /// How many top tokens to report log-probabilities for; `None` computes none.
    logprobs: Option<usize>,
    /// False for a benchmark, which must decode exactly `max_new_tokens`.
    ends_at_stop_token: bool,
    stats: GenerationStats,
    started: Instant,
    first_token_at: Option<Instant>,
    finished: Option<FinishReason>,
    /// Whether the prompt is read and `next` holds its prediction.
    prompt_read: bool,
    /// Where a pass ends, whatever its length, when it reaches it (see
    /// [`CheckedPrompt::with_history`]).
    history_end: Option<usize>,
}

impl<'a> GenerationSession<'a> {
    /// Prefills `prompt`, reusing the longest prefix already in `cache`.
    pub fn start(
        loaded: &'a LoadedModel,
        cache: &'a mut KvCache,
        prompt: &[u32],
        params: &SamplingParams,
        max_new_tokens: usize,
    ) -> Result<Self, GenerationError> {
        let checked = CheckedPrompt::new(prompt.to_vec(), cache.max_len(), params)?;
        let mut read_on = |_| ControlFlow::Continue(());
        Self::start_reading(loaded, cache, checked, max_new_tokens, &mut read_on)
    }

    /// [`start`](Self::start), reading a prompt longer than [`PROMPT_CHUNK`] in passes and
    /// telling `progress` before each; when it answers `Break`, reading stops there and the
    /// session is already finished as [`FinishReason::Stopped`] (what was read stays cached).
    pub fn start_reading(
        loaded: &'a LoadedModel,
        cache: &'a mut KvCache,
        checked: CheckedPrompt,
        max_new_tokens: usize,
        progress: &mut dyn FnMut(PromptProgress) -> ControlFlow<()>,
    ) -> Result<Self, GenerationError> {
        let mut session = Self::begin_checked(loaded, cache, checked, max_new_tokens);
        while session.is_reading() {
            if let Some(at) = session.reported_progress()
                && progress(at).is_break()
            {
                session.finished = Some(FinishReason::Stopped);
                break;
            }
            session.read_pass()?;
        }
        Ok(session)
    }

    /// A session whose prompt is still to be read, pass by pass ([`read_pass`](Self::read_pass)),
    /// reusing the longest prefix already in `cache`: what the engine starts, so that other
    /// sequences' steps can run between the passes. What could refuse it is checked first, so
    /// it takes the cache only once nothing can fail.
    pub fn begin_checked(
        loaded: &'a LoadedModel,
        cache: &'a mut KvCache,
        checked: CheckedPrompt,
        max_new_tokens: usize,
    ) -> Self {
        let CheckedPrompt {
            prompt,
            sampler,
            history,
        } = checked;
        // At least the last prompt token is run again, for its logits, unless the cache kept
        // them with the whole prompt.
        cache.truncate(cache.reusable_prefix(&prompt));
        let stats = GenerationStats {
            prompt_tokens: prompt.len(),
            reused_tokens: cache.len(),
            context_used: cache.len(),
            context_limit: cache.max_len(),
            device_reads: 1,
            ..GenerationStats::default()
        };
        Self {
            loaded,
            sampler,
            decoder: StreamDecoder::new(&loaded.tokenizer, true),
            cache,
            prompt,
            next: Prediction::Logits(Vec::new()),
            max_new_tokens,
            logprobs: None,
            ends_at_stop_token: true,
            stats,
            started: Instant::now(),
            first_token_at: None,
            finished: None,
            prompt_read: false,
            history_end: (history >= SHARED_HISTORY).then_some(history),
        }
    }

    /// The cache it reads and writes, as it stands.
    pub fn cache(&self) -> &KvCache {
        self.cache
    }

    /// The cache the session held, once it is over: for the next conversation to reuse.
    pub fn into_cache(self) -> &'a mut KvCache {
        self.cache
    }

    /// The positions its cache holds, or will once the prompt is read.
    pub fn positions(&self) -> usize {
        self.prompt.len().max(self.cache.len())
    }

    /// Whether the generation is over (a step said so, or it was stopped).
    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// Whether passes of the prompt are still to be read (and not stopped).
    pub fn is_reading(&self) -> bool {
        self.finished.is_none() && !self.prompt_read
    }

    /// Prompt tokens still to be run through the model.
    pub fn unread(&self) -> usize {
        self.prompt.len().saturating_sub(self.cache.len())
    }

    /// How far reading has come, before the next pass: only for prompts that take several
    /// passes, whose reading is worth showing.
    pub fn reported_progress(&self) -> Option<PromptProgress> {
        let unread_at_start = self.prompt.len() - self.stats.reused_tokens;
        (self.is_reading() && unread_at_start > PROMPT_CHUNK).then(|| PromptProgress {
            done: self.cache.len(),
            total: self.prompt.len(),
        })
    }

    /// Reads the next pass of at most [`PROMPT_CHUNK`] prompt tokens and returns how many it
    /// read. Passes start where the prompt's reading began, every [`PROMPT_CHUNK`] tokens: a
    /// prompt sent again reads in the same passes (see `KvCache::reusable_prefix`). A prompt
    /// the cache holds whole with its prediction reads nothing and takes that.
    pub fn read_pass(&mut self) -> Result<usize, GenerationError> {
        if !self.is_reading() {
            return Ok(0);
        }
        let from = self.cache.len();
        let to = match self.history_end {
            Some(end) if from < end => (from + PROMPT_CHUNK).min(end),
            _ => (from + PROMPT_CHUNK).min(self.prompt.len()),
        };
        let kept = self.cache.prediction().filter(|_| from == to);
        let next = match kept {
            Some(logits) => Some(logits.to_vec()),
            None => {
                let last =
                    self.loaded
                        .model
                        .forward(&self.prompt[from..to], self.cache, Logits::Last)?;
                (to == self.prompt.len())
                    .then(|| logits_to_vec(last))
                    .transpose()?
            }
        };
        self.stats.prefilled_tokens = to - self.stats.reused_tokens;
        self.stats.prefill_time = self.started.elapsed();
        self.stats.context_used = to;
        self.stats.kv_cache_bytes = self.cache.bytes();
        if let Some(logits) = next {
            if from < to {
                self.cache.keep_prediction(&logits);
            }
            self.next = Prediction::Logits(logits);
            self.prompt_read = true;
        }
        Ok(to - from)
    }

    /// Decodes exactly `max_new_tokens` (or until the context is full): the model's own
    /// end of reply does not end a measurement early.
    pub fn ignoring_stop_tokens(mut self) -> Self {
        self.ends_at_stop_token = false;
        self
    }

    /// Reports each token's log-probability and the `top` likeliest alternatives' (see
    /// [`TokenLogprobs`]); `None` (the default) spends nothing on them.
    pub fn with_logprobs(mut self, top: Option<usize>) -> Self {
        self.logprobs = top;
        self
    }

    pub fn stats(&self) -> &GenerationStats {
        &self.stats
    }

    /// Samples the next token, feeds it to the model and returns it; or says why it is over.
    /// Whatever of the prompt is still unread is read first.
    pub fn step(&mut self) -> Result<Step, GenerationError> {
        while self.is_reading() {
            self.read_pass()?;
        }
        let step = self.choose()?;
        if let Step::Token(token) = &step {
            let logits = self
                .loaded
                .model
                .forward(&[token.id], self.cache, Logits::Last)?;
            self.predict(logits)?;
        }
        Ok(step)
    }

    /// The first half of a step: samples the next token (the model has yet to run it, see
    /// [`predict_together`]), or says why the generation is over. Its reader can be told of it
    /// before the model runs it, as the engine tells a prompt's first token.
    pub fn choose(&mut self) -> Result<Step, GenerationError> {
        if let Some(reason) = self.finished {
            return Ok(Step::Finished {
                reason,
                text: String::new(),
            });
        }
        if self.stats.generated_tokens >= self.max_new_tokens {
            return Ok(self.finish(FinishReason::MaxTokens));
        }
        if self.cache.len() >= self.cache.max_len() {
            return Ok(self.finish(FinishReason::ContextFull));
        }
        let sampled = match &self.next {
            Prediction::Logits(logits) => self.sampler.sample(logits, self.cache.tokens())?,
            Prediction::Top { top, row } => match self.sampler.sample_top(top)? {
                Some(sampled) => sampled,
                None => {
                    let logits = logits_to_vec(row.clone())?;
                    self.stats.device_reads += 1;
                    self.sampler.sample(&logits, self.cache.tokens())?
                }
            },
        };
        let now = Instant::now();
        match self.first_token_at {
            None => {
                self.first_token_at = Some(now);
                self.stats.time_to_first_token = now - self.started;
            }
            Some(first) => self.stats.decode_time = now - first,
        }
        if self.ends_at_stop_token && self.loaded.stop_tokens.contains(sampled.id) {
            return Ok(self.finish(FinishReason::StopToken));
        }
        self.stats.generated_tokens += 1;
        let text = self.decoder.push(sampled.id)?.unwrap_or_default();
        let piece = |id: u32| {
            self.loaded
                .tokenizer
                .decode(&[id], false)
                .unwrap_or_default()
        };
        let alternatives = sampled
            .alternatives
            .iter()
            .map(|&(id, probability)| (id, piece(id), probability))
            .collect();
        // A session asked for log-probabilities reads every row whole.
        let logits = match &self.next {
            Prediction::Logits(logits) => Some(logits),
            Prediction::Top { .. } => None,
        };
        let logprobs = self.logprobs.zip(logits).map(|(top, logits)| {
            let (logprob, top) = log_softmax_top(logits, sampled.id, top);
            TokenLogprobs {
                text: piece(sampled.id),
                logprob,
                top: top
                    .into_iter()
                    .map(|(id, logprob)| (id, piece(id), logprob))
                    .collect(),
            }
        });
        Ok(Step::Token(TokenEvent {
            id: sampled.id,
            text,
            probability: sampled.probability,
            alternatives,
            logprobs,
        }))
    }

    /// The second half of a step: takes the logits (`[1, vocab]`) the model gave for the
    /// token [`choose`](Self::choose) returned, which is now in the cache.
    fn predict(&mut self, logits: Tensor<2>) -> Result<(), GenerationError> {
        self.next = match self.read_top(&logits)? {
            Some(top) => Prediction::Top { top, row: logits },
            None => Prediction::Logits(logits_to_vec(logits)?),
        };
        self.stats.device_reads += 1;
        self.stats.context_used = self.cache.len();
        self.stats.kv_cache_bytes = self.cache.bytes();
        Ok(())
    }

    /// On a GPU, the likeliest tokens of `row` (`[1, vocab]`) and the weight of all of them
    /// at the sampler's temperature, found on the device and read back in one piece. `None`
    /// where the whole row is read instead: on the CPU backends (it is in memory already), and
    /// when log-probabilities or a repetition penalty need all of it.
    fn read_top(&self, row: &Tensor<2>) -> Result<Option<TopLogits>, GenerationError> {
        if self.loaded.device.backend != BackendKind::Gpu
            || self.logprobs.is_some()
            || self.sampler.params().repetition_penalty != 1.0
        {
            return Ok(None);
        }
        let [_, vocab_size] = row.dims();
        let count = TOP_TOKENS_READ.min(vocab_size);
        let Some(top) = top_entries(row, count) else {
            return Ok(None);
        };
        let temperature = self.sampler.params().weight_temperature();
        let max = top.clone().narrow(1, 0, 1);
        let total = (row.clone() - max).div_scalar(temperature).exp().sum_dim(1);
        let read = logits_to_vec(Tensor::cat(vec![top, total], 1))?;
        let (logits, rest) = read.split_at(count);
        let (ids, total) = rest.split_at(count);
        Ok(Some(TopLogits {
            ids: ids.iter().map(|&id| id as u32).collect(),
            logits: logits.to_vec(),
            total_weight: total.first().map_or(f64::NAN, |&t| f64::from(t)),
            vocab_size,
        }))
    }

    /// Ends the generation early (Stop pressed), flushing held-back text.
    pub fn stop(&mut self) -> Step {
        self.finish(FinishReason::Stopped)
    }

    fn finish(&mut self, reason: FinishReason) -> Step {
        self.finished = Some(reason);
        // A partial character at the very end cannot be completed any more; what the decoder
        // would make of it is at worst a replacement character, never an error worth more.
        let text = self.decoder.finish().ok().flatten().unwrap_or_default();
        Step::Finished { reason, text }
    }
}

/// The second half of a step ([`GenerationSession::choose`]) of each of several sessions of
/// one model: the token each chose (`None` where it chose none) goes through the model
/// together with the others ([`crate::model::Llama::forward_each`]), which reads each weight
/// once for all of them and gives each session, bit for bit, what
/// [`GenerationSession::step`] gives it alone. One result per session.
pub fn predict_together(
    loaded: &LoadedModel,
    sessions: &mut [&mut GenerationSession<'_>],
    chosen: &[Option<u32>],
) -> Vec<Result<(), GenerationError>> {
    let mut results: Vec<Result<(), GenerationError>> = sessions.iter().map(|_| Ok(())).collect();
    let (stepping, tokens): (Vec<usize>, Vec<u32>) = chosen
        .iter()
        .enumerate()
        .filter_map(|(i, token)| Some((i, (*token)?)))
        .unzip();
    if stepping.is_empty() {
        return results;
    }
    let logits = {
        let mut caches: Vec<&mut KvCache> = sessions
            .iter_mut()
            .zip(chosen)
            .filter(|(_, token)| token.is_some())
            .map(|(session, _)| &mut *session.cache)
            .collect();
        loaded.model.forward_each(&tokens, &mut caches)
    };
    match logits {
        Ok(logits) => {
            for (row, &i) in stepping.iter().enumerate() {
                results[i] = sessions[i].predict(logits.clone().narrow(0, row, 1));
            }
        }
        Err(err) => {
            let message = err.to_string();
            for &i in &stepping {
                results[i] = Err(ModelError::Backend(message.clone()).into());
            }
        }
    }
    results
}
