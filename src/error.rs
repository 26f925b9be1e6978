//! One error type for the library. Every variant renders as a single line that names the
//! file or tensor and says what to do; the CLI maps it to an exit code.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input file is malformed, truncated or hostile. Exit code 2.
    #[error("{}: {msg}", path.display())]
    BadInput { path: PathBuf, msg: String },

    /// The request cannot be honoured for this tensor/type (unsupported type, shape a type
    /// cannot hold, non-finite weights, ...). Exit code 2.
    #[error("{0}")]
    Unsupported(String),

    /// Bad command-line usage or configuration. Exit code 2.
    #[error("{0}")]
    Usage(String),

    /// An I/O failure on a named path. Exit code 1.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn bad_input(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::BadInput {
            path: path.into(),
            msg: one_line(&msg.into()),
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Process exit code: 2 for anything the user can fix in the input or flags, 1 for I/O.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Io { .. } => 1,
            _ => 2,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Messages quote names taken from (possibly hostile) files: escape control characters so an
/// error always stays on one line and cannot drive the terminal.
pub fn one_line(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
