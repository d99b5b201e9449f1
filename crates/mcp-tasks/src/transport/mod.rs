//! Transports: Streamable HTTP ([`http`]) and stdio ([`stdio`]). Both hand raw JSON-RPC
//! messages to the one entry of both protocol eras (the internal `era` module, reached through
//! a [`crate::RuntimeHandle`]) and map the outcome it returns (a response, a stream of
//! messages, or nothing for a notification) to their wire.

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
mod server;
pub mod stdio;
