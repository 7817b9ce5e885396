//! The one error a setting can produce: which variable, the value given, the accepted form, and
//! (when a library said why) the library's own error as its source.

/// A configuration value that cannot be used.
///
/// The message names the variable, the value and the form that is accepted; it is all an operator
/// needs, so the source (a parser's own error, an I/O error) is kept for callers that walk the
/// chain and is not repeated in the message.
#[derive(Debug, thiserror::Error)]
#[error("invalid {var}={value:?}: expected {expected}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub expected: std::borrow::Cow<'static, str>,
    #[source]
    pub source: Option<ValueError>,
}

impl ConfigError {
    pub fn new(
        var: &'static str,
        value: impl Into<String>,
        expected: impl Into<std::borrow::Cow<'static, str>>,
    ) -> ConfigError {
        ConfigError {
            var,
            value: value.into(),
            expected: expected.into(),
            source: None,
        }
    }

    /// The same error, with the underlying reason the value was refused.
    pub fn because(self, source: impl Into<ValueError>) -> ConfigError {
        ConfigError {
            source: Some(source.into()),
            ..self
        }
    }
}

/// Why a library refused a value, when one did.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error(transparent)]
    Size(#[from] parse_size::Error),
    #[error(transparent)]
    Duration(#[from] humantime::DurationError),
    #[error(transparent)]
    Integer(#[from] std::num::ParseIntError),
    #[error(transparent)]
    Number(#[from] std::num::ParseFloatError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    LogFilter(#[from] tracing_subscriber::filter::ParseError),
    /// Boxed: it carries where in the file, which would make every setting's error large.
    #[error(transparent)]
    Secrets(Box<super::secrets::SecretsError>),
}

impl From<super::secrets::SecretsError> for ValueError {
    fn from(error: super::secrets::SecretsError) -> ValueError {
        ValueError::Secrets(Box::new(error))
    }
}
