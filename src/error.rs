//! One error type for the library. Every variant renders as a single line that names the
//! file or tensor and says what to do; the CLI maps it to an exit code.

use std::path::PathBuf;

/// Exit code of an [`Error::Internal`]: EX_SOFTWARE from BSD's sysexits.h ("an internal software
/// error has been detected"), far from the codes the user's own mistakes get (1, 2) and from
/// `tq validate`'s verdicts (3, 4).
pub const EXIT_INTERNAL: i32 = 70;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input file is malformed, truncated or hostile. Exit code 2.
    #[error("{}: {msg}", path.display())]
    BadInput { path: PathBuf, msg: String },

    /// The request cannot be honoured for this tensor/type (unsupported type, shape a type
    /// cannot hold, non-finite weights, ...). Exit code 2.
    #[error("{0}")]
    Unsupported(String),

    /// Bad command-line usage or configuration: something the user can fix in the flags. Exit
    /// code 2.
    #[error("{0}")]
    Usage(String),

    /// An I/O failure on a named path. Exit code 1.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A fault in tq itself, not in the input or the flags: a broken invariant, a worker thread
    /// that panicked, a value of ours that would not serialize. Nothing the user can fix but
    /// report it. Exit code [`EXIT_INTERNAL`] (70).
    #[error("internal error: {0} (this is a bug in tq; please report it)")]
    Internal(String),
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

    /// An [`Error::Internal`]: `msg` says what broke (the message adds that it is a bug).
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(one_line(&msg.into()))
    }

    /// Process exit code: 2 for anything the user can fix in the input or flags, 1 for I/O,
    /// [`EXIT_INTERNAL`] (70) for a bug in tq.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Io { .. } => 1,
            Error::Internal(_) => EXIT_INTERNAL,
            Error::BadInput { .. } | Error::Unsupported(_) | Error::Usage(_) => 2,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_per_variant() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        assert_eq!(Error::io("/x", io).exit_code(), 1);
        assert_eq!(Error::bad_input("/x", "bad").exit_code(), 2);
        assert_eq!(Error::Unsupported("no".into()).exit_code(), 2);
        assert_eq!(Error::Usage("--flag".into()).exit_code(), 2);
        assert_eq!(Error::internal("broken").exit_code(), 70);
        assert_eq!(EXIT_INTERNAL, 70);
    }

    /// An internal error is one line that says what broke and that it is tq's bug to report,
    /// even when the message it was given spans lines.
    #[test]
    fn internal_error_is_one_line_that_asks_for_a_report() {
        let e = Error::internal("writer thread panicked\nat src/convert.rs:1");
        let s = e.to_string();
        assert_eq!(s.lines().count(), 1, "{s}");
        assert!(!s.chars().any(char::is_control), "{s}");
        assert!(
            s.starts_with("internal error: writer thread panicked"),
            "{s}"
        );
        assert!(s.contains("bug in tq") && s.contains("report"), "{s}");
        assert_eq!(e.exit_code(), 70);
    }
}
