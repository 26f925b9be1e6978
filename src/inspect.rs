//! `tq inspect` report.
