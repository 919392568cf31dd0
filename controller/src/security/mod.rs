//! TLS and admission: the controller's CA and serving certificate ([`certs`] decides, [`tls`]
//! keeps them in a Secret and publishes the CA), the bounded TLS accept loop both servers use
//! ([`listener`]), and the admission webhook server ([`webhook`]).
//!
//! Nothing here reads the index or the reconcilers' state.

pub mod certs;
pub mod listener;
pub mod tls;
pub mod webhook;
