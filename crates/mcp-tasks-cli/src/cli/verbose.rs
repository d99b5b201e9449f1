//! `--verbose`: a [`Transport`] that prints every JSON-RPC message it sends (`>`) and
//! receives (`<`) on stderr, one compact line each, around the transport that carries them.
//! The bearer token travels in a header, never in a message, so it is not printed.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::StreamExt;
use mcp_tasks::client::{ClientError, Response, Transport};
use serde_json::Value;

/// Prints the exchange of the transport it wraps.
pub struct Verbose {
    inner: Arc<dyn Transport>,
}

impl Verbose {
    pub fn new(inner: Arc<dyn Transport>) -> Self {
        Self { inner }
    }
}

fn show(direction: char, message: &Value) {
    eprintln!("{direction} {message}");
}

impl Transport for Verbose {
    fn send(&self, message: Value) -> BoxFuture<'_, Result<Response, ClientError>> {
        Box::pin(async move {
            show('>', &message);
            match self.inner.send(message).await {
                Ok(Response::Message(v)) => {
                    show('<', &v);
                    Ok(Response::Message(v))
                }
                Ok(Response::Stream(stream)) => Ok(Response::Stream(
                    stream
                        .inspect(|item| match item {
                            Ok(v) => show('<', v),
                            Err(e) => eprintln!("< (stream error: {e})"),
                        })
                        .boxed(),
                )),
                Ok(Response::Accepted) => {
                    eprintln!("< (accepted, no body)");
                    Ok(Response::Accepted)
                }
                Err(e) => {
                    eprintln!("< (error: {e})");
                    Err(e)
                }
            }
        })
    }

    fn endpoint(&self) -> String {
        self.inner.endpoint()
    }
}
