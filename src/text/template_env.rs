//! A minijinja environment that behaves like the Jinja2 sandbox transformers
//! renders chat templates in. Templates on the Hub are written against Python
//! Jinja2, so every difference here would silently change the prompt the model sees.

use std::io;

use minijinja::value::{Kwargs, StringInput};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter, Serializer};

/// Builds the environment with transformers' settings: `trim_blocks` and
/// `lstrip_blocks` on, trailing newline of the template dropped, loop controls,
/// Python string/dict methods, `raise_exception`, `strftime_now` and a Python-compatible
/// `tojson`.
///
/// A template comes with a model, from anyone, and runs in the app's process: it gets a
/// budget of instructions ([`TEMPLATE_FUEL`]), and `indent` a bounded width, so that a loop
/// that never ends or a filter that asks for exabytes is an error that names the template
/// rather than a hung or aborted app. Its output is bounded by the renderer (see
/// [`crate::text::ChatTemplate::render_with`]).
pub(crate) fn python_like_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("indent", bounded_indent);
    env
}

/// Instructions a template may run per rendering. The real templates (Qwen3's, the longest
/// here, with tools) take a few thousand per message; a 500-message chat stays far below
/// this, and two nested `range(100000)` loops run out of it in well under a second.
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// The widest `indent` a template may ask for: tool prompts indent JSON by 2 or 4.
const MAX_INDENT: usize = 1024;

/// Jinja's `indent`, refusing widths no prompt needs (`indent(2**62)` would allocate that).
fn bounded_indent(
    value: StringInput<'_>,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let asked = match width {
        Some(width) => Some(width),
        None => kwargs.get::<Option<usize>>("width")?,
    };
    if let Some(width) = asked.filter(|&width| width > MAX_INDENT) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("indent width {width} is more than {MAX_INDENT}"),
        ));
    }
    minijinja::filters::indent(value, width, first, blank, kwargs)
}

/// Templates call this to reject conversations they cannot format (e.g. roles out
/// of order); the message is the template author's explanation, so keep it intact.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers gives templates the local time, formatted by Python's `strftime`: Llama 3's
/// writes today's date into its system prompt with it (and a date of its own without it).
fn strftime_now(format: String) -> Result<Value, Error> {
    use std::fmt::Write;
    let mut text = String::new();
    write!(text, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now cannot format {format:?}"),
        )
    })?;
    Ok(Value::from(text))
}

/// transformers' `tojson` is `json.dumps(value, ensure_ascii=False, indent=indent)`:
/// `", "` and `": "` separators, non-ASCII kept, no HTML escaping. minijinja's
/// built-in filter escapes `<`, `>` and `&`, which would change tool prompts.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(width) => {
            let spaces = vec![b' '; width];
            value.serialize(&mut Serializer::with_formatter(
                &mut out,
                PrettyFormatter::with_indent(&spaces),
            ))
        }
        None => value.serialize(&mut Serializer::with_formatter(&mut out, PythonCompact)),
    };
    written.map_err(|err| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson could not serialize the value: {err}"),
        )
    })?;
    let text = String::from_utf8(out).map_err(|err| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson produced invalid UTF-8: {err}"),
        )
    })?;
    Ok(Value::from_safe_string(text))
}

/// Python's default single-line JSON layout.
struct PythonCompact;

impl Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}
