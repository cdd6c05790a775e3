use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::engine::EngineError;

/// Seconds a client refused for a full queue is told to wait: about one short reply.
const RETRY_AFTER_SECONDS: u32 = 1;

/// An error in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with its
/// HTTP status, so that OpenAI's client libraries raise their usual exceptions.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A value the request got wrong, naming the field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        let mut error = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("{param}: {}", message.into()),
        );
        error.param = Some(param.to_string());
        error
    }

    pub fn bad_json(reason: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the body is not valid JSON: {reason}"),
        )
        .with_code("invalid_json")
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or wrong API key: send the key given to `smolchat serve --api-key` as `Authorization: Bearer KEY`",
        )
        .with_code("invalid_api_key")
    }

    /// A request this server does not take from where it came (Host, Origin).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "invalid_request_error", message).with_code("forbidden")
    }

    pub fn unsupported_media_type(found: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!("the body must be sent as Content-Type: application/json, not {found:?}"),
        )
        .with_code("unsupported_media_type")
    }

    pub fn unknown_model(asked: &str, served: &str) -> Self {
        let mut error = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model {asked:?} does not exist; this server has {served:?}"),
        )
        .with_code("model_not_found");
        error.param = Some("model".into());
        error
    }

    pub fn unknown_path(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no such endpoint: {method} {path}; see GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /health"),
        )
        .with_code("unknown_url")
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{path} does not take {method}"),
        )
    }

    /// The request was refused because the engine's queue is full; try again shortly.
    pub fn busy() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is busy: its queue of requests is full; retry after a moment",
        )
        .with_code("queue_full")
    }

    pub fn engine_gone() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the inference engine has shut down",
        )
        .with_code("engine_stopped")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// A body that did not arrive whole within the body timeout.
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f32()
            ),
        )
        .with_code("request_timeout")
    }

    /// A body axum could not read: too large (413) or broken off.
    pub fn from_body(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "the request body is larger than this server accepts",
            )
            .with_code("request_too_large")
        } else {
            Self::new(
                rejection.status(),
                "invalid_request_error",
                rejection.body_text(),
            )
        }
    }

    /// The status of each engine failure; `prompt_field` names what was too long.
    pub fn from_engine(error: &EngineError, prompt_field: &str) -> Self {
        let too_long = |excess: usize| {
            let mut api = Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!(
                    "{error}: {excess} tokens too many; shorten the {prompt_field} or lower max_tokens"
                ),
            )
            .with_code("context_length_exceeded");
            api.param = Some(prompt_field.to_string());
            api
        };
        match error {
            EngineError::ContextFull { needed, limit } => too_long(needed.saturating_sub(*limit)),
            // The reply needs at least one position.
            EngineError::PromptTooLong { prompt, limit } => {
                too_long(prompt.saturating_sub(*limit) + 1)
            }
            EngineError::InvalidSampling { .. } | EngineError::Prompt { .. } => Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                error.to_string(),
            ),
            EngineError::NoModel
            | EngineError::ModelNotFound { .. }
            | EngineError::ModelLoad { .. }
            | EngineError::Download { .. }
            | EngineError::DownloadStopped { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                error.to_string(),
            )
            .with_code("model_not_loaded"),
            EngineError::Generation { .. } | EngineError::Internal => {
                Self::internal(error.to_string())
            }
        }
    }

    /// The body alone, for an error that ends a stream already under way.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE && self.code == Some("queue_full") {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}
