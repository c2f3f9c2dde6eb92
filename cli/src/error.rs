//! The tool's errors: one line each, and the exit code they give.

use std::fmt;

use tensor_history::Error;

/// `Result` with a [`CliError`].
pub(crate) type CliResult<T> = Result<T, CliError>;

/// Why a command failed, and how the process exits.
#[derive(Debug)]
pub(crate) enum CliError {
    /// Bad usage or input: an unknown ref, a missing repository, a bad argument. Exit 2.
    Usage(String),
    /// A check or an operation failed: damaged data, I/O, a concurrent writer. Exit 1.
    Failed(String),
}

impl CliError {
    pub(crate) fn usage(msg: impl Into<String>) -> CliError {
        CliError::Usage(msg.into())
    }

    pub(crate) fn failed(msg: impl Into<String>) -> CliError {
        CliError::Failed(msg.into())
    }

    /// The library error `e`, met while doing `context` (for example "repository
    /// `runs/a`"), classified as bad input or failure.
    pub(crate) fn from_lib(e: &Error, context: &str) -> CliError {
        let msg = if context.is_empty() {
            e.to_string()
        } else {
            format!("{context}: {e}")
        };
        if is_bad_input(e) {
            CliError::Usage(msg)
        } else {
            CliError::Failed(msg)
        }
    }

    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

/// Errors that say the request was wrong rather than that something broke.
fn is_bad_input(e: &Error) -> bool {
    matches!(
        e,
        Error::UnknownVariable { .. }
            | Error::VariableExists { .. }
            | Error::UnknownVersion { .. }
            | Error::PrunedVersion { .. }
            | Error::UnknownRef { .. }
            | Error::RefExists { .. }
            | Error::InvalidRefName { .. }
            | Error::WrongRefKind { .. }
            | Error::BranchCheckedOut { .. }
            | Error::NoCommits
            | Error::InvalidArgument { .. }
            | Error::InvalidConfig { .. }
    )
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (CliError::Usage(m) | CliError::Failed(m)) = self;
        // One line, whatever the message holds.
        let line: String = m
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        write!(f, "error: {line}")
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> CliError {
        CliError::Failed(e.to_string())
    }
}

/// Attach a context to a library result.
pub(crate) trait Context<T> {
    /// Map the error with [`CliError::from_lib`].
    fn context(self, what: &str) -> CliResult<T>;
}

impl<T> Context<T> for Result<T, Error> {
    fn context(self, what: &str) -> CliResult<T> {
        self.map_err(|e| CliError::from_lib(&e, what))
    }
}
