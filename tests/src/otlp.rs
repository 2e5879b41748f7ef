//! Tracing test servers: an OTLP receiver, over HTTP (`POST /v1/traces`, protobuf
//! `ExportTraceServiceRequest`) or gRPC (the collector's trace service), that keeps every span
//! with its service name, and an HTTP downstream that records the headers of every request it
//! answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{any, post};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue as Any, KeyValue};
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// Resource attributes as text.
    pub resource: HashMap<String, String>,
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, empty for a root span.
    pub parent_span_id: String,
    /// OTLP span kind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer.
    pub kind: i32,
    /// Attributes as text.
    pub attributes: HashMap<String, String>,
    /// Names of the span's events.
    pub events: Vec<String>,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// Span kinds as OTLP numbers them.
pub const KIND_SERVER: i32 = 2;
pub const KIND_CLIENT: i32 = 3;
pub const KIND_PRODUCER: i32 = 4;
pub const KIND_CONSUMER: i32 = 5;

/// An OTLP/HTTP receiver on loopback; stopped on Drop.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    requests: Arc<Mutex<u64>>,
    task: JoinHandle<()>,
}

impl OtlpReceiver {
    /// A receiver on a free port.
    pub async fn start() -> OtlpReceiver {
        OtlpReceiver::start_on(0).await
    }

    /// A receiver on `port` (0: any free one), e.g. one a service was pointed at while it was down.
    pub async fn start_on(port: u16) -> OtlpReceiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("receiver address");
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let requests: Arc<Mutex<u64>> = Arc::default();
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state((spans.clone(), requests.clone()));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        OtlpReceiver { addr, spans, requests, task }
    }

    /// A receiver of OTLP over gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) on a free port.
    pub async fn start_grpc() -> OtlpReceiver {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind the OTLP/gRPC receiver");
        let addr = listener.local_addr().expect("receiver address");
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let requests: Arc<Mutex<u64>> = Arc::default();
        let service =
            TraceServiceServer::new(GrpcReceiver { spans: spans.clone(), requests: requests.clone() });
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ =
                tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
        });
        OtlpReceiver { addr, spans, requests, task }
    }

    /// `http://127.0.0.1:<port>`: the value of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().expect("spans").clone()
    }

    /// The spans of trace `trace_id`.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect()
    }

    /// Export requests received so far.
    pub fn requests(&self) -> u64 {
        *self.requests.lock().expect("requests")
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Received = (Arc<Mutex<Vec<ReceivedSpan>>>, Arc<Mutex<u64>>);

async fn receive(State((spans, requests)): State<Received>, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    *requests.lock().expect("requests") += 1;
    spans.lock().expect("spans").extend(flatten(request));
    StatusCode::OK
}

/// The collector's trace service, keeping what it receives.
struct GrpcReceiver {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    requests: Arc<Mutex<u64>>,
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        *self.requests.lock().expect("requests") += 1;
        self.spans.lock().expect("spans").extend(flatten(request.into_inner()));
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// Every span of an export request, flattened.
fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    resource: resource.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    events: span.events.into_iter().map(|e| e.name).collect(),
                });
            }
        }
    }
    received
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map(text).unwrap_or_default())).collect()
}

fn text(value: &Any) -> String {
    match &value.value {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// An HTTP downstream on loopback that records the headers of every request and answers with
/// the statuses it was given in turn (then 200); stopped on Drop.
pub struct Downstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<HashMap<String, String>>>>,
    task: JoinHandle<()>,
}

type DownstreamState = (Arc<Mutex<Vec<HashMap<String, String>>>>, Arc<Mutex<Vec<u16>>>);

impl Downstream {
    /// A downstream answering 200 to everything.
    pub async fn start() -> Downstream {
        Downstream::failing_first(&[]).await
    }

    /// A downstream answering `statuses` to its first requests, then 200.
    pub async fn failing_first(statuses: &[u16]) -> Downstream {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind the downstream");
        let addr = listener.local_addr().expect("downstream address");
        let seen: Arc<Mutex<Vec<HashMap<String, String>>>> = Arc::default();
        let statuses = Arc::new(Mutex::new(statuses.iter().rev().copied().collect::<Vec<u16>>()));
        let app = axum::Router::new().fallback(any(answer)).with_state((seen.clone(), statuses));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Downstream { addr, seen, task }
    }

    /// `http://127.0.0.1:<port>/run`.
    pub fn url(&self) -> String {
        format!("http://{}/run", self.addr)
    }

    /// The headers of every request so far (names in lower case), in order.
    pub fn requests(&self) -> Vec<HashMap<String, String>> {
        self.seen.lock().expect("requests").clone()
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State((seen, statuses)): State<DownstreamState>, headers: HeaderMap) -> StatusCode {
    let recorded = headers
        .iter()
        .map(|(name, value)| (name.as_str().to_string(), value.to_str().unwrap_or_default().to_string()))
        .collect();
    seen.lock().expect("requests").push(recorded);
    let status = statuses.lock().expect("statuses").pop().unwrap_or(200);
    StatusCode::from_u16(status).unwrap_or(StatusCode::OK)
}
