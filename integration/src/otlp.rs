//! A real OTLP/gRPC trace receiver for the tests: the collector's `TraceService` (from the
//! `opentelemetry-proto` crate's generated tonic server) on a loopback port, keeping every span
//! it is sent, flattened to what the tests assert on (service, name, ids, parent, links,
//! attributes).
//!
//! Helpers fail the caller on any error: this is test code, not product code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;

/// One received span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// Span name.
    pub name: String,
    /// Trace id, lowercase hex.
    pub trace_id: String,
    /// Span id, lowercase hex.
    pub span_id: String,
    /// Parent span id, lowercase hex; empty for a root.
    pub parent_span_id: String,
    /// Linked spans: (trace id, span id), lowercase hex.
    pub links: Vec<(String, String)>,
    /// Attributes, each value rendered as a string.
    pub attributes: BTreeMap<String, String>,
    /// Status code (0 unset, 1 ok, 2 error).
    pub status: i32,
}

impl Span {
    /// The attribute `key`, or "" when absent.
    pub fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn render(kv: &KeyValue) -> (String, String) {
    let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    };
    (kv.key.clone(), value)
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut out = Vec::new();
        for rs in request.into_inner().resource_spans {
            let resource: BTreeMap<String, String> = rs
                .resource
                .map(|r| r.attributes.iter().map(render).collect())
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(Span {
                        service: service.clone(),
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        links: s
                            .links
                            .iter()
                            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                            .collect(),
                        attributes: s.attributes.iter().map(render).collect(),
                        status: s.status.map_or(0, |st| st.code),
                    });
                }
            }
        }
        self.0.lock().unwrap().extend(out);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The receiver, serving until dropped.
pub struct Receiver {
    /// Where it listens (127.0.0.1).
    pub addr: SocketAddr,
    sink: Sink,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    /// Starts a receiver on a free loopback port.
    pub fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let sink = Sink::default();
        let service = TraceServiceServer::new(sink.clone());
        runtime.spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::error!(error = %e, "OTLP receiver stopped");
            }
        });
        Receiver {
            addr,
            sink,
            _runtime: runtime,
        }
    }

    /// The endpoint URL exporters are given.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.sink.0.lock().unwrap().clone()
    }
}
