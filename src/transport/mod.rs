//! Transports: Streamable HTTP ([`http`]) and stdio ([`stdio`]). Both hand raw JSON-RPC
//! messages to a [`crate::RuntimeHandle`] and map its [`crate::Dispatched`] to their wire.

pub mod http;
mod server;
pub mod stdio;
