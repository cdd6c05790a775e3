//! Picking the next token from the model's logits. Everything here is
//! deterministic for a given seed — ranking uses a total order with ties broken
//! by id, sums run in a fixed order and `exp` is computed with plain IEEE
//! arithmetic instead of the platform's libm — so a conversation replays
//! identically on every run and machine.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How many of the most likely tokens are reported next to the chosen one.
pub const ALTERNATIVES: usize = 5;

/// Top-p is first tried on this many of the best tokens; the window grows only when
/// their mass falls short, which keeps a full sort of the vocabulary rare.
const INITIAL_NUCLEUS_WIDTH: usize = 256;

/// Knobs for one reply. The defaults suit a small chat model: a little randomness
/// for natural replies (temperature 0.7), the unlikely tail cut by top-p 0.9 and
/// min-p 0.05 (which adapts to how confident the model is, so no fixed top-k is
/// needed). The repetition penalty is off by default, as in transformers and llama.cpp,
/// so that temperature 0 reproduces their greedy output exactly; the settings offer it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 picks the most likely token every time.
    pub temperature: f32,
    /// Keep the smallest set of likeliest tokens holding this much probability; 1 = off.
    pub top_p: f32,
    /// Keep only this many likeliest tokens; 0 = off.
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the likeliest one; 0 = off.
    pub min_p: f32,
    /// Discourage tokens already in the conversation (Hugging Face semantics); 1 = off.
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl SamplingParams {
    /// The temperature token weights are taken at: the sampler's, or 1 when greedy, whose
    /// reported probabilities are the model's own softmax. A GPU's read of the row's total
    /// weight and [`Sampler::sample_top`]'s weights of the read tokens must agree on it.
    pub fn weight_temperature(&self) -> f64 {
        if self.temperature == 0.0 {
            1.0
        } else {
            f64::from(self.temperature)
        }
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 0,
            min_p: 0.05,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Error)]
pub enum SamplingError {
    #[error(
        "temperature must be a finite number of at least 0 (0 = always the likeliest token), got {0}"
    )]
    Temperature(f32),
    #[error("top_p must be greater than 0 and at most 1 (1 = off), got {0}")]
    TopP(f32),
    #[error("min_p must be at least 0 and less than 1 (0 = off), got {0}")]
    MinP(f32),
    #[error("repetition_penalty must be a finite number greater than 0 (1 = off), got {0}")]
    RepetitionPenalty(f32),
    #[error("the model returned no logits")]
    EmptyLogits,
    #[error("the model returned {0} logits, more than token ids can address")]
    TooManyLogits(usize),
    #[error("the model returned an invalid logit {value} for token {id}")]
    InvalidLogit { id: u32, value: f32 },
    #[error("every token has a logit of -infinity, so there is nothing to choose from")]
    NoCandidates,
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            return Err(SamplingError::MinP(self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(SamplingError::RepetitionPenalty(self.repetition_penalty));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    /// Probability of `id` in the distribution it was drawn from (after all
    /// filters); for greedy decoding, its softmax probability at temperature 1.
    pub probability: f32,
    /// The likeliest tokens of that same distribution, best first, the chosen one
    /// included; fewer than five when the filters kept fewer.
    pub alternatives: Vec<(u32, f32)>,
}

#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Ok(Self { params, rng })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token. Steps, in Hugging Face's order: repetition penalty,
    /// temperature, top-k, top-p, min-p, renormalise, draw.
    pub fn sample(
        &mut self,
        logits: &[f32],
        previous_tokens: &[u32],
    ) -> Result<SampledToken, SamplingError> {
        let mut logits = checked_logits(logits)?;
        apply_repetition_penalty(&mut logits, previous_tokens, self.params.repetition_penalty);

        if self.params.temperature == 0.0 {
            return greedy(&logits);
        }
        let distribution = filtered_distribution(&logits, &self.params)?;
        Ok(self.draw(distribution))
    }

    /// Chooses the next token as [`Sampler::sample`] would from the whole row of logits, from
    /// only its likeliest tokens and the weight of all of them (what a GPU reads back instead
    /// of the vocabulary). `None` when those cannot decide: tokens beyond them could be kept
    /// (top-k past them, or a nucleus or min-p pool reaching past them), a repetition penalty
    /// (it changes logits that were not read), or values [`Sampler::sample`] rejects. Then
    /// nothing is drawn, so the caller can read all the logits and sample as usual.
    pub fn sample_top(&mut self, top: &TopLogits) -> Result<Option<SampledToken>, SamplingError> {
        let read = top.ids.len();
        if self.params.repetition_penalty != 1.0
            || read == 0
            || top.logits.len() != read
            || top.logits.iter().any(|l| l.is_nan() || *l == f32::INFINITY)
            || !(top.total_weight.is_finite() && top.total_weight > 0.0)
        {
            return Ok(None);
        }
        let mut ranked: Vec<(u32, f32)> = top
            .ids
            .iter()
            .copied()
            .zip(top.logits.iter().copied())
            .collect();
        ranked.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let max = f64::from(ranked[0].1);
        if max == f64::NEG_INFINITY {
            return Ok(None);
        }
        let greedy = self.params.temperature == 0.0;
        let temperature = self.params.weight_temperature();
        let ids: Vec<u32> = ranked.iter().map(|&(id, _)| id).collect();
        let weights: Vec<f64> = ranked
            .iter()
            .map(|&(_, logit)| portable_exp((f64::from(logit) - max) / temperature))
            .collect();
        if greedy {
            let best = ids.len().min(ALTERNATIVES);
            let distribution = Distribution {
                ids: ids[..best].to_vec(),
                weights: weights[..best].to_vec(),
                total: top.total_weight,
            };
            return Ok(Some(distribution.token(0)));
        }

        // As `filtered_distribution`, on the read tokens. Every unread token ranks below
        // every read one, so each filter keeps a prefix of `ids`.
        let everything_read = read >= top.vocab_size;
        let drawable = weights.iter().take_while(|&&w| w > 0.0).count();
        let top_k = self.params.top_k;
        let (pool, pool_total, mut covered) = if top_k > 0 && top_k < top.vocab_size {
            if top_k > read {
                return Ok(None);
            }
            let pool = top_k.min(drawable);
            (pool, weights[..pool].iter().sum(), true)
        } else {
            // An unread token's weight is at most the last read one's: none is drawable once a
            // read one underflowed.
            (
                drawable,
                top.total_weight,
                everything_read || drawable < read,
            )
        };
        let (passing, reached) = kept_prefix(&weights[..pool], pool_total, &self.params);
        // A read token below min-p puts every unread one below it too.
        covered |= passing < pool;
        let kept = match reached {
            Some(kept) => kept,
            None if covered => passing,
            None => return Ok(None),
        };
        if kept == 0 {
            return Err(SamplingError::NoCandidates);
        }
        Ok(Some(self.draw(Distribution::new_ranked(
            ids[..kept].to_vec(),
            weights[..kept].to_vec(),
        ))))
    }

    /// Draws from `distribution` with the sampler's generator.
    fn draw(&mut self, distribution: Distribution) -> SampledToken {
        let threshold = self.rng.random::<f64>() * distribution.total;
        let mut cumulative = 0.0;
        let mut chosen = distribution.ids.len() - 1;
        for (index, weight) in distribution.weights.iter().enumerate() {
            cumulative += weight;
            if cumulative > threshold {
                chosen = index;
                break;
            }
        }
        distribution.token(chosen)
    }
}

/// The likeliest tokens of a row of logits, in any order, and the weight of the whole row:
/// `Σ exp((logit - max) / T)` over the vocabulary, `T` the sampler's temperature (1 when
/// greedy), so that the likeliest token weighs 1.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogits {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub total_weight: f64,
    pub vocab_size: usize,
}

/// The log-probability of `chosen` and of the `top` likeliest tokens (best first, ties to the
/// lower id) under the model's own distribution: log-softmax of the raw logits at temperature 1,
/// before the repetition penalty and every filter, which is what OpenAI's `logprobs` report.
/// Costs one pass over the vocabulary, so it runs only when asked for.
pub fn log_softmax_top(logits: &[f32], chosen: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max = f64::from(max);
    let sum: f64 = logits
        .iter()
        .map(|&logit| (f64::from(logit) - max).exp())
        .sum();
    let log_total = max + sum.ln();
    let logprob = |id: u32| {
        logits.get(id as usize).map_or(f32::NEG_INFINITY, |&logit| {
            (f64::from(logit) - log_total) as f32
        })
    };
    let all: Vec<u32> = (0..logits.len() as u32).collect();
    let ranked = top_ranked(&all, logits, top.min(logits.len()));
    (
        logprob(chosen),
        ranked.into_iter().map(|id| (id, logprob(id))).collect(),
    )
}

/// Candidate tokens, likeliest first, with unnormalised weights.
struct Distribution {
    ids: Vec<u32>,
    weights: Vec<f64>,
    total: f64,
}

impl Distribution {
    fn new(ids: Vec<u32>, all_weights: &[f64]) -> Self {
        let weights: Vec<f64> = ids.iter().map(|&id| all_weights[id as usize]).collect();
        Self::new_ranked(ids, weights)
    }

    /// `weights[i]` is `ids[i]`'s.
    fn new_ranked(ids: Vec<u32>, weights: Vec<f64>) -> Self {
        let total = weights.iter().sum();
        Self {
            ids,
            weights,
            total,
        }
    }

    /// `index` must be below `ids.len()`.
    fn token(&self, index: usize) -> SampledToken {
        let probability = |i: usize| (self.weights[i] / self.total) as f32;
        SampledToken {
            id: self.ids[index],
            probability: probability(index),
            alternatives: (0..self.ids.len().min(ALTERNATIVES))
                .map(|i| (self.ids[i], probability(i)))
                .collect(),
        }
    }
}

/// Rejects logits no healthy model produces; `-inf` is allowed because it is how
/// tokens get masked out.
fn checked_logits(logits: &[f32]) -> Result<Vec<f32>, SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    if u32::try_from(logits.len() - 1).is_err() {
        return Err(SamplingError::TooManyLogits(logits.len()));
    }
    if let Some((id, &value)) = logits
        .iter()
        .enumerate()
        .find(|(_, value)| value.is_nan() || **value == f32::INFINITY)
    {
        return Err(SamplingError::InvalidLogit {
            id: id as u32,
            value,
        });
    }
    Ok(logits.to_vec())
}

/// Hugging Face semantics: each distinct earlier token once, positive logits
/// divided by the penalty and negative ones multiplied, so the token always
/// becomes less likely.
fn apply_repetition_penalty(logits: &mut [f32], previous_tokens: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut distinct = previous_tokens.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    for id in distinct {
        if let Some(logit) = logits.get_mut(id as usize) {
            *logit = if *logit > 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
        }
    }
}

fn greedy(logits: &[f32]) -> Result<SampledToken, SamplingError> {
    // One pass for the best few instead of ranking the vocabulary, and the softmax total with
    // the platform's `exp`: greedy output never depends on it (the argmax decides), and over
    // 49152 logits the portable series and the ranking cost about 8% of a decode step.
    let mut best: Vec<u32> = Vec::with_capacity(ALTERNATIVES + 1);
    let before = |a: u32, b: u32| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
            .is_lt()
    };
    for id in 0..logits.len() as u32 {
        if best.len() == ALTERNATIVES && !before(id, best[ALTERNATIVES - 1]) {
            continue;
        }
        let at = best.partition_point(|&other| before(other, id));
        best.insert(at, id);
        best.truncate(ALTERNATIVES);
    }
    let max = best
        .first()
        .map_or(f32::NEG_INFINITY, |&id| logits[id as usize]);
    if max == f32::NEG_INFINITY {
        return Err(SamplingError::NoCandidates);
    }
    let weight = |logit: f32| (f64::from(logit) - f64::from(max)).exp();
    let distribution = Distribution {
        weights: best.iter().map(|&id| weight(logits[id as usize])).collect(),
        ids: best,
        // Probabilities are reported against the whole vocabulary.
        total: logits.iter().map(|&logit| weight(logit)).sum(),
    };
    Ok(distribution.token(0))
}

/// `exp((logit - max) / temperature)` for every token: softmax numerators scaled
/// so the likeliest token weighs exactly 1.
fn relative_weights(logits: &[f32], temperature: f32) -> Result<Vec<f64>, SamplingError> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Err(SamplingError::NoCandidates);
    }
    let (max, temperature) = (f64::from(max), f64::from(temperature));
    Ok(logits
        .iter()
        .map(|&logit| portable_exp((f64::from(logit) - max) / temperature))
        .collect())
}

fn filtered_distribution(
    logits: &[f32],
    params: &SamplingParams,
) -> Result<Distribution, SamplingError> {
    let weights = relative_weights(logits, params.temperature)?;
    // Tokens whose weight underflowed can never be drawn.
    let mut pool: Vec<u32> = (0..logits.len() as u32)
        .filter(|&id| weights[id as usize] > 0.0)
        .collect();
    if params.top_k > 0 && params.top_k < pool.len() {
        pool = top_ranked(&pool, logits, params.top_k);
    }
    // Top-p measures mass against everything top-k left, before min-p.
    let pool_total: f64 = pool.iter().map(|&id| weights[id as usize]).sum();
    // Min-p's survivors are a prefix of the ranking: taken out before it, they leave a few
    // dozen tokens to rank instead of the vocabulary, and `kept_prefix` finds them all
    // passing.
    if let Some(min_weight) = min_p_weight(params) {
        pool.retain(|&id| weights[id as usize] >= min_weight);
    }
    let kept = nucleus(&pool, logits, &weights, pool_total, params);
    if kept.is_empty() {
        return Err(SamplingError::NoCandidates);
    }
    Ok(Distribution::new(kept, &weights))
}

/// What min-p and top-p keep of `pool` ([`kept_prefix`]), found on a growing window of the
/// best tokens so the usual case sorts only a few hundred entries: the window is wide
/// enough once top-p is reached in it, or once a token in it falls below min-p (every token
/// past the window ranks lower still).
fn nucleus(
    pool: &[u32],
    logits: &[f32],
    weights: &[f64],
    total: f64,
    params: &SamplingParams,
) -> Vec<u32> {
    let mut width = pool.len().min(INITIAL_NUCLEUS_WIDTH);
    loop {
        let mut ranked = top_ranked(pool, logits, width);
        let ranked_weights: Vec<f64> = ranked.iter().map(|&id| weights[id as usize]).collect();
        let (passing, reached) = kept_prefix(&ranked_weights, total, params);
        if let Some(kept) = reached {
            ranked.truncate(kept);
            return ranked;
        }
        if passing < ranked.len() || width == pool.len() {
            ranked.truncate(passing);
            return ranked;
        }
        width = pool.len().min(width * 8);
    }
}

/// What min-p and top-p keep of a best-first run of `weights` (the likeliest token weighs
/// 1): how many pass min-p, and the length of the smallest prefix of those that holds `top_p`
/// of `pool_total`, when they hold that much. Both samplers' filters, on whatever they ranked.
fn kept_prefix(
    weights: &[f64],
    pool_total: f64,
    params: &SamplingParams,
) -> (usize, Option<usize>) {
    let passing = match min_p_weight(params) {
        None => weights.len(),
        Some(min_weight) => weights.iter().take_while(|&&w| w >= min_weight).count(),
    };
    let reached = top_p_prefix(&weights[..passing], pool_total, params.top_p);
    (passing, reached)
}

/// The weight below which min-p drops a token, when it is on: the likeliest token weighs 1,
/// so `min_p · max_prob` is `min_p` itself.
fn min_p_weight(params: &SamplingParams) -> Option<f64> {
    (params.min_p > 0.0).then(|| f64::from(params.min_p))
}

/// The length of the smallest prefix of `weights` (best first) holding `top_p` of `total`;
/// `None` when top-p is off or they hold less.
fn top_p_prefix(weights: &[f64], total: f64, top_p: f32) -> Option<usize> {
    if top_p >= 1.0 {
        return None;
    }
    let target = f64::from(top_p) * total;
    let mut cumulative = 0.0;
    weights
        .iter()
        .position(|&w| {
            cumulative += w;
            cumulative >= target
        })
        .map(|end| end + 1)
}

/// The `count` best of `ids`, best first: higher logit wins, ties go to the lower id.
fn top_ranked(ids: &[u32], logits: &[f32], count: usize) -> Vec<u32> {
    let by_rank = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut ranked = ids.to_vec();
    if count == 0 {
        ranked.clear();
    } else if count < ranked.len() {
        ranked.select_nth_unstable_by(count - 1, by_rank);
        ranked.truncate(count);
    }
    ranked.sort_unstable_by(by_rank);
    ranked
}

/// `1/n!` for the Taylor series of `e^r`; 14 terms reach f64 precision for
/// `|r| <= ln2/2`. Evaluated at compile time, so identical everywhere.
const INVERSE_FACTORIALS: [f64; 14] = {
    let mut coefficients = [1.0; 14];
    let mut n = 1;
    while n < coefficients.len() {
        coefficients[n] = coefficients[n - 1] / n as f64;
        n += 1;
    }
    coefficients
};

/// `e^x` for `x <= 0` using only basic IEEE operations, which round identically on
/// every platform (unlike libm's `exp`). Weights below `e^-700` are treated as 0:
/// next to the top token's weight of 1 they cannot influence a draw.
fn portable_exp(x: f64) -> f64 {
    if x.is_nan() || x < -700.0 {
        return 0.0;
    }
    // ln2 split in two (as in fdlibm) so that `k * LN2_HI` is exact and the
    // reduction stays accurate for large |k|.
    const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
    // x = k·ln2 + r with |r| ≤ ln2/2; e^r by Taylor series, 2^k by building the float.
    let k = (x * std::f64::consts::LOG2_E).round();
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let mut sum = INVERSE_FACTORIALS[INVERSE_FACTORIALS.len() - 1];
    for &coefficient in INVERSE_FACTORIALS.iter().rev().skip(1) {
        sum = sum * r + coefficient;
    }
    // k lies in [-1010, 0], so the exponent field stays in the normal range.
    let exponent = (k as i64 + 1023) as u64;
    sum * f64::from_bits(exponent << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            min_p,
            repetition_penalty: 1.0,
            seed: 7,
        }
    }

    /// The `count` likeliest of `logits` as a GPU reads them back, shuffled, with the whole
    /// row's weight at the sampler's temperature.
    fn top_of(logits: &[f32], count: usize, params: &SamplingParams) -> TopLogits {
        let all: Vec<u32> = (0..logits.len() as u32).collect();
        let mut ids = top_ranked(&all, logits, count);
        ids.reverse();
        let temperature = params.weight_temperature();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        TopLogits {
            logits: ids.iter().map(|&id| logits[id as usize]).collect(),
            ids,
            total_weight: logits
                .iter()
                .map(|&l| ((f64::from(l) - f64::from(max)) / temperature).exp())
                .sum(),
            vocab_size: logits.len(),
        }
    }

    /// Every filter setting on two shapes of distribution: where the likeliest tokens decide,
    /// they choose what the whole row chooses (same generator, same draw, same alternatives);
    /// where they cannot, they say so without drawing.
    #[test]
    fn the_likeliest_tokens_choose_as_the_whole_row_or_decline() {
        let peaked: Vec<f32> = (0..1000).map(|i| -(i as f32) * 0.5).collect();
        let flat: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
            .collect();
        let (mut decided, mut declined) = (0, 0);
        for logits in [&peaked, &flat] {
            for (temperature, top_k, top_p, min_p) in [
                (0.0, 0, 1.0, 0.0),
                (0.7, 0, 0.9, 0.05),
                (1.0, 40, 1.0, 0.0),
                (1.0, 200, 1.0, 0.0),
                (1.0, 0, 1.0, 0.0),
                (1.3, 0, 0.95, 0.0),
                (0.8, 0, 1.0, 0.1),
            ] {
                let params = SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    repetition_penalty: 1.0,
                    seed: 7,
                };
                let mut whole = Sampler::new(params.clone()).expect("valid");
                let mut top = Sampler::new(params.clone()).expect("valid");
                for _ in 0..20 {
                    let expected = whole.sample(logits, &[]).expect("samples");
                    let Some(token) = top
                        .sample_top(&top_of(logits, 64, &params))
                        .expect("samples")
                    else {
                        declined += 1;
                        break;
                    };
                    decided += 1;
                    assert_eq!(token.id, expected.id, "{params:?}");
                    assert!((token.probability - expected.probability).abs() < 1e-5);
                    let ids =
                        |t: &SampledToken| t.alternatives.iter().map(|a| a.0).collect::<Vec<_>>();
                    assert_eq!(ids(&token), ids(&expected), "{params:?}");
                }
            }
        }
        assert!(
            decided > 100 && declined > 0,
            "{decided} decided, {declined} declined"
        );
    }

    #[test]
    fn a_repetition_penalty_or_a_top_k_past_the_read_tokens_declines() {
        let logits: Vec<f32> = (0..300).map(|i| -(i as f32) * 0.01).collect();
        for params in [
            SamplingParams {
                repetition_penalty: 1.1,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_k: 100,
                ..SamplingParams::default()
            },
        ] {
            let top = top_of(&logits, 64, &params);
            let mut sampler = Sampler::new(params).expect("valid");
            assert_eq!(sampler.sample_top(&top).expect("no error"), None);
        }
    }

    fn logits_of(probabilities: &[f64]) -> Vec<f32> {
        probabilities.iter().map(|p| p.ln() as f32).collect()
    }

    fn kept(logits: &[f32], params: &SamplingParams) -> Vec<u32> {
        filtered_distribution(logits, params)
            .expect("distribution")
            .ids
    }

    /// Straightforward reference: full sort, then each filter exactly as specified.
    fn naive_kept(logits: &[f32], params: &SamplingParams) -> Vec<u32> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weight = |id: u32| {
            ((f64::from(logits[id as usize]) - f64::from(max)) / f64::from(params.temperature))
                .exp()
        };
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        ids.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        if params.top_k > 0 {
            ids.truncate(params.top_k);
        }
        let total: f64 = ids.iter().map(|&id| weight(id)).sum();
        if params.top_p < 1.0 {
            let mut cumulative = 0.0;
            let mut end = ids.len();
            for (index, &id) in ids.iter().enumerate() {
                cumulative += weight(id);
                if cumulative >= f64::from(params.top_p) * total {
                    end = index + 1;
                    break;
                }
            }
            ids.truncate(end);
        }
        let best = weight(ids[0]);
        ids.retain(|&id| weight(id) >= f64::from(params.min_p) * best);
        ids
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
    }

    #[test]
    fn invalid_params_are_rejected_with_the_value() {
        let base = SamplingParams::default();
        let cases = [
            (
                SamplingParams {
                    temperature: -0.1,
                    ..base.clone()
                },
                "temperature",
                "-0.1",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..base.clone()
                },
                "temperature",
                "NaN",
            ),
            (
                SamplingParams {
                    temperature: f32::INFINITY,
                    ..base.clone()
                },
                "temperature",
                "inf",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..base.clone()
                },
                "top_p",
                "0",
            ),
            (
                SamplingParams {
                    top_p: 1.5,
                    ..base.clone()
                },
                "top_p",
                "1.5",
            ),
            (
                SamplingParams {
                    min_p: 1.0,
                    ..base.clone()
                },
                "min_p",
                "1",
            ),
            (
                SamplingParams {
                    min_p: -0.2,
                    ..base.clone()
                },
                "min_p",
                "-0.2",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..base.clone()
                },
                "repetition_penalty",
                "0",
            ),
            (
                SamplingParams {
                    repetition_penalty: -1.0,
                    ..base.clone()
                },
                "repetition_penalty",
                "-1",
            ),
        ];
        for (params, name, value) in cases {
            let message = params.validate().expect_err("must be rejected").to_string();
            assert!(message.starts_with(name), "{message}");
            assert!(message.ends_with(&format!("got {value}")), "{message}");
            assert!(Sampler::new(params).is_err());
        }
    }

    #[test]
    fn bad_logits_are_errors() {
        let mut sampler = Sampler::new(params(1.0, 1.0, 0, 0.0)).expect("valid");
        assert_eq!(sampler.sample(&[], &[]), Err(SamplingError::EmptyLogits));
        assert!(matches!(
            sampler.sample(&[0.0, f32::NAN], &[]),
            Err(SamplingError::InvalidLogit { id: 1, .. })
        ));
        assert!(matches!(
            sampler.sample(&[f32::INFINITY], &[]),
            Err(SamplingError::InvalidLogit { id: 0, .. })
        ));
        assert_eq!(
            sampler.sample(&[f32::NEG_INFINITY; 3], &[]),
            Err(SamplingError::NoCandidates)
        );
    }

    #[test]
    fn greedy_takes_the_argmax_and_reports_softmax() {
        let mut sampler = Sampler::new(params(0.0, 1.0, 0, 0.0)).expect("valid");
        let logits = [1.0, 3.0, 3.0, 0.0, f32::NEG_INFINITY];
        let token = sampler.sample(&logits, &[]).expect("sample");
        // Tie between ids 1 and 2: the lower id wins.
        assert_eq!(token.id, 1);
        let e = std::f64::consts::E;
        let total = e + 2.0 * e.powi(3) + 1.0;
        let p_top = (e.powi(3) / total) as f32;
        assert!((token.probability - p_top).abs() < 1e-6);
        let ids: Vec<u32> = token.alternatives.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 0, 3, 4]);
        assert!((token.alternatives[2].1 - (e / total) as f32).abs() < 1e-6);
        assert_eq!(token.alternatives[4].1, 0.0);
    }

    #[test]
    fn top_k_keeps_the_k_best() {
        let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
        assert_eq!(kept(&logits, &params(1.0, 1.0, 2, 0.0)), [1, 3]);
        assert_eq!(kept(&logits, &params(1.0, 1.0, 1, 0.0)), [1]);
        assert_eq!(kept(&logits, &params(1.0, 1.0, 10, 0.0)), [1, 3, 2, 0]);
        let distribution = filtered_distribution(&logits, &params(1.0, 1.0, 2, 0.0)).expect("ok");
        let token = distribution.token(1);
        assert_eq!(token.id, 3);
        assert!((token.probability - 3.0 / 7.0).abs() < 1e-6);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        let logits = logits_of(&[0.05, 0.5, 0.15, 0.3]);
        assert_eq!(kept(&logits, &params(1.0, 0.45, 0, 0.0)), [1]);
        assert_eq!(kept(&logits, &params(1.0, 0.75, 0, 0.0)), [1, 3]);
        assert_eq!(kept(&logits, &params(1.0, 0.85, 0, 0.0)), [1, 3, 2]);
        assert_eq!(kept(&logits, &params(1.0, 0.97, 0, 0.0)), [1, 3, 2, 0]);
        // Mass is measured after temperature: at 0.5 the weights are p², so
        // 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025) ≈ 0.68 for the best token alone.
        assert_eq!(kept(&logits, &params(0.5, 0.65, 0, 0.0)), [1]);
        assert_eq!(kept(&logits, &params(0.5, 0.7, 0, 0.0)), [1, 3]);
    }

    #[test]
    fn min_p_drops_tokens_far_below_the_best() {
        let logits = logits_of(&[0.05, 0.5, 0.15, 0.3]);
        assert_eq!(kept(&logits, &params(1.0, 1.0, 0, 0.2)), [1, 3, 2]);
        assert_eq!(kept(&logits, &params(1.0, 1.0, 0, 0.5)), [1, 3]);
        assert_eq!(kept(&logits, &params(1.0, 1.0, 0, 0.9)), [1]);
        // Top-p runs first, against the full distribution.
        assert_eq!(kept(&logits, &params(1.0, 0.75, 0, 0.2)), [1, 3]);
    }

    #[test]
    fn filters_match_a_naive_implementation_on_large_vocabularies() {
        let mut rng = ChaCha8Rng::seed_from_u64(99);
        for round in 0..40 {
            // Wide and flat distributions force the nucleus window to grow.
            let spread = if round % 2 == 0 { 0.5 } else { 8.0 };
            let logits: Vec<f32> = (0..5000)
                .map(|_| (rng.random::<f32>() - 0.5) * spread)
                .collect();
            for params in [
                params(1.0, 0.9, 0, 0.0),
                params(0.7, 0.5, 0, 0.0),
                params(1.3, 0.99, 1000, 0.0),
                params(0.7, 0.9, 0, 0.05),
                params(1.0, 1.0, 40, 0.01),
                params(1.0, 1.0, 0, 0.0),
            ] {
                assert_eq!(
                    kept(&logits, &params),
                    naive_kept(&logits, &params),
                    "{params:?}"
                );
            }
        }
    }

    #[test]
    fn repetition_penalty_follows_hugging_face() {
        let mut logits = [2.0, -1.0, 0.5, 0.0];
        apply_repetition_penalty(&mut logits, &[0, 1, 1, 3, 99], 2.0);
        // Each distinct id once; out-of-range ids ignored; 0 stays 0.
        assert_eq!(logits, [1.0, -2.0, 0.5, 0.0]);

        let mut sampler = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0, 1.0, 0, 0.0)
        })
        .expect("valid");
        assert_eq!(sampler.sample(&[2.0, 1.5], &[]).expect("sample").id, 0);
        assert_eq!(sampler.sample(&[2.0, 1.5], &[0]).expect("sample").id, 1);
    }

    fn draw_many(params: &SamplingParams, logits: &[f32], count: usize) -> Vec<u32> {
        let mut sampler = Sampler::new(params.clone()).expect("valid");
        (0..count)
            .map(|_| sampler.sample(logits, &[]).expect("sample").id)
            .collect()
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits = logits_of(&[0.3, 0.25, 0.2, 0.15, 0.1]);
        let params = SamplingParams {
            repetition_penalty: 1.0,
            ..SamplingParams::default()
        };
        let first = draw_many(&params, &logits, 200);
        assert_eq!(first, draw_many(&params, &logits, 200));
        let reseeded = SamplingParams { seed: 8, ..params };
        assert_ne!(first, draw_many(&reseeded, &logits, 200));
    }

    #[test]
    fn seeded_draws_are_pinned() {
        // Guards portability: these ids must not change across machines or releases.
        let logits = logits_of(&[0.3, 0.25, 0.2, 0.15, 0.1]);
        let drawn = draw_many(&params(1.0, 1.0, 0, 0.0), &logits, 16);
        assert_eq!(drawn, PINNED_DRAWS);
    }

    const PINNED_DRAWS: [u32; 16] = [0, 0, 2, 2, 2, 1, 0, 3, 1, 4, 0, 1, 1, 0, 1, 1];

    /// Chi-square goodness of fit; with 5 degrees of freedom the 0.1% critical
    /// value is 20.52, so a correct sampler passes and a biased one cannot.
    fn assert_frequencies_match(params: &SamplingParams, logits: &[f32], expected: &[f64]) {
        const DRAWS: usize = 20_000;
        let mut counts = vec![0usize; expected.len()];
        for id in draw_many(params, logits, DRAWS) {
            counts[id as usize] += 1;
        }
        let chi_square: f64 = counts
            .iter()
            .zip(expected)
            .map(|(&observed, &p)| {
                let expected = p * DRAWS as f64;
                (observed as f64 - expected).powi(2) / expected
            })
            .sum();
        assert!(
            chi_square < 20.52,
            "chi² {chi_square:.2}, counts {counts:?}"
        );
    }

    #[test]
    fn draws_follow_the_distribution() {
        let probabilities = [0.35, 0.25, 0.2, 0.1, 0.07, 0.03];
        let logits = logits_of(&probabilities);
        assert_frequencies_match(&params(1.0, 1.0, 0, 0.0), &logits, &probabilities);

        let squared: Vec<f64> = probabilities.iter().map(|p| p * p).collect();
        let total: f64 = squared.iter().sum();
        let sharpened: Vec<f64> = squared.iter().map(|p| p / total).collect();
        assert_frequencies_match(&params(0.5, 1.0, 0, 0.0), &logits, &sharpened);
    }

    #[test]
    fn sampled_token_reports_its_distribution() {
        let logits = logits_of(&[0.05, 0.5, 0.15, 0.3, 0.0001, 0.0001, 0.0001]);
        let mut sampler = Sampler::new(params(1.0, 0.75, 0, 0.0)).expect("valid");
        for _ in 0..50 {
            let token = sampler.sample(&logits, &[]).expect("sample");
            let expected = match token.id {
                1 => 0.5 / 0.8,
                3 => 0.3 / 0.8,
                other => panic!("token {other} is outside the nucleus"),
            };
            assert!((f64::from(token.probability) - expected).abs() < 1e-5);
            assert_eq!(token.alternatives.len(), 2);
            assert_eq!(token.alternatives[0].0, 1);
        }
    }

    #[test]
    fn log_softmax_top_is_the_log_of_the_raw_softmax() {
        let logits = [1.0, 3.0, 3.0, 0.0, f32::NEG_INFINITY];
        let (chosen, top) = log_softmax_top(&logits, 3, 3);
        let e = std::f64::consts::E;
        let total = e + 2.0 * e.powi(3) + 1.0;
        assert!((f64::from(chosen) - (1.0 / total).ln()).abs() < 1e-6);
        let ids: Vec<u32> = top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 0]);
        assert!((f64::from(top[0].1) - (e.powi(3) / total).ln()).abs() < 1e-6);
        assert_eq!(log_softmax_top(&logits, 4, 0), (f32::NEG_INFINITY, vec![]));
    }

    #[test]
    fn portable_exp_matches_std() {
        for step in 0..=70_000 {
            let x = -f64::from(step) / 100.0;
            let (ours, reference) = (portable_exp(x), x.exp());
            assert!(
                (ours - reference).abs() <= 1e-14 * reference,
                "exp({x}) = {ours}, std says {reference}"
            );
        }
        assert_eq!(portable_exp(0.0), 1.0);
        assert_eq!(portable_exp(f64::NEG_INFINITY), 0.0);
    }
}
