//! Transports: Streamable HTTP ([`http`]) and stdio ([`stdio`]). Both hand raw JSON-RPC
//! messages to a [`crate::RuntimeHandle`] and map its [`crate::Dispatched`] to their wire.

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
mod server;
pub mod stdio;
