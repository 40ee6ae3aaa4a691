//! A fake Kubernetes API server for the discovery tests: real HTTP/1.1 on
//! 127.0.0.1 (hyper, OS-picked port), so the real `kube::Client` and
//! kube-runtime watcher run against it unchanged.
//!
//! It serves LIST and WATCH of pods, endpointslices (discovery.k8s.io/v1)
//! and inferencepools (inference.networking.k8s.io/v1) in one namespace,
//! from in-memory objects that tests mutate, following the API server's
//! contract as far as these clients can tell:
//! - one resourceVersion counter across kinds (etcd's revision), stamped on
//!   every write; `metadata.uid`, `namespace`, `creationTimestamp` filled in;
//! - LIST: `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`),
//!   `fieldSelector` (`metadata.name`, `metadata.namespace`; other fields are
//!   a 400 as on a real server), `limit` + `continue` pagination over a
//!   snapshot (an unknown token is a 410), list `metadata.resourceVersion`;
//!   items of built-in kinds carry no `apiVersion`/`kind`, CRD items do;
//! - WATCH (`?watch=true`): chunked transfer encoding, one JSON event per
//!   line (`ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK`/`ERROR`), from the given
//!   resourceVersion (`0` or none: synthetic `ADDED`s of the current objects
//!   first); selector transitions become `ADDED`/`DELETED` like the watch
//!   cache's; `BOOKMARK`s only with `allowWatchBookmarks=true`;
//!   `timeoutSeconds` ends the watch cleanly; a resourceVersion older than
//!   the last [`State::compact`] gets HTTP 200 and an `ERROR` event holding a
//!   `Status` with code 410 (`Expired`, "too old resource version"), as the
//!   real server answers;
//! - another namespace is 403 (the RBAC Role is namespaced), another path 404,
//!   another verb 405, all as `Status` objects.
//!
//! Faults for tests: drop every open watch cleanly or cut its connection,
//! expire open watches (a 410 `ERROR` event mid-stream), fail the next LISTs
//! with a status code, hold LISTs until released.

/// The namespace, pool and pod labels the scenarios use.
pub const NS: &str = "llm";
pub const POOL: &str = "vllm-pool";
pub const APP: &[(&str, &str)] = &[("app", "vllm")];

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc as fmpsc;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Pod,
    EndpointSlice,
    InferencePool,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Pod, Kind::EndpointSlice, Kind::InferencePool];

    fn api_version(self) -> &'static str {
        match self {
            Kind::Pod => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::InferencePool => "inference.networking.k8s.io/v1",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::InferencePool => "InferencePool",
        }
    }

    /// `/api/v1` or `/apis/<group>/<version>`, then `namespaces/<ns>/<plural>`.
    fn prefix_and_plural(self) -> (&'static str, &'static str) {
        match self {
            Kind::Pod => ("/api/v1/namespaces/", "pods"),
            Kind::EndpointSlice => ("/apis/discovery.k8s.io/v1/namespaces/", "endpointslices"),
            Kind::InferencePool => ("/apis/inference.networking.k8s.io/v1/namespaces/", "inferencepools"),
        }
    }

    /// CRDs are served as unstructured JSON: list items keep their type.
    fn items_carry_type(self) -> bool {
        self == Kind::InferencePool
    }
}

/// One request the server answered, for assertions.
#[derive(Clone, Debug)]
pub struct Logged {
    pub kind: Kind,
    pub watch: bool,
    pub query: BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
struct Entry {
    rv: u64,
    kind: Kind,
    old: Option<Value>,
    new: Value,
    deleted: bool,
}

struct Page {
    kind: Kind,
    rv: u64,
    rest: Vec<Value>,
}

/// The server's objects and fault switches. Tests reach it through
/// [`FakeKube::edit`] (one locked step: watches see all of it or none).
pub struct State {
    namespace: String,
    rv: u64,
    objects: HashMap<Kind, BTreeMap<String, Value>>,
    history: Vec<Entry>,
    /// Watches from a resourceVersion below this get 410.
    compacted: u64,
    drop_epoch: u64,
    drop_abrupt: bool,
    expire_epoch: u64,
    bookmark_epoch: u64,
    bookmarks_sent: usize,
    failing_lists: HashMap<Kind, VecDeque<u16>>,
    held_lists: HashSet<Kind>,
    pages: HashMap<String, Page>,
    next_token: u64,
    uids: u64,
    requests: Vec<Logged>,
    open_watches: HashMap<Kind, usize>,
    closed: bool,
}

impl State {
    /// Creates or replaces `obj` (a `metadata.name` is required): `ADDED` or
    /// `MODIFIED` at a new resourceVersion.
    pub fn put(&mut self, kind: Kind, mut obj: Value) {
        let name = obj["metadata"]["name"].as_str().expect("test object without metadata.name").to_owned();
        self.rv += 1;
        let old = self.objects.entry(kind).or_default().get(&name).cloned();
        let uid = match old.as_ref().and_then(|o| o["metadata"]["uid"].as_str()) {
            Some(uid) => uid.to_owned(),
            None => {
                self.uids += 1;
                format!("00000000-0000-4000-8000-{:012}", self.uids)
            }
        };
        obj["apiVersion"] = json!(kind.api_version());
        obj["kind"] = json!(kind.kind());
        let meta = &mut obj["metadata"];
        meta["namespace"] = json!(self.namespace);
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(self.rv.to_string());
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        self.objects.entry(kind).or_default().insert(name, obj.clone());
        self.history.push(Entry { rv: self.rv, kind, old, new: obj, deleted: false });
    }

    /// Removes the object: `DELETED` carrying its last state at a new
    /// resourceVersion. False if there was none.
    pub fn delete(&mut self, kind: Kind, name: &str) -> bool {
        let Some(old) = self.objects.entry(kind).or_default().remove(name) else { return false };
        self.rv += 1;
        let mut gone = old.clone();
        gone["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.history.push(Entry { rv: self.rv, kind, old: Some(old), new: gone, deleted: true });
        true
    }

    /// Forgets history: a watch from any resourceVersion before now gets 410.
    /// Open watches keep streaming (they are past it), as on a real server.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
    }

    /// Ends every open watch: cleanly (terminating chunk, like a server-side
    /// timeout) or by cutting the connection mid-stream.
    pub fn drop_watches(&mut self, abrupt: bool) {
        self.drop_epoch += 1;
        self.drop_abrupt = abrupt;
    }

    /// Every open watch gets an `ERROR` event with a 410 `Status`, then ends.
    pub fn expire_watches(&mut self) {
        self.expire_epoch += 1;
    }

    /// Every open watch that asked for bookmarks gets one at the current
    /// resourceVersion.
    pub fn bookmark(&mut self) {
        self.bookmark_epoch += 1;
    }
}

struct Shared {
    state: Mutex<State>,
    /// Bumped after every change of `state`: open watches and held lists
    /// wait on it.
    wake: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn edit<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.lock());
        self.wake.send_modify(|v| *v += 1);
        r
    }
}

/// The running server. [`FakeKube::shutdown`] (or drop) stops it and every
/// connection it serves.
pub struct FakeKube {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Option<tokio::task::JoinHandle<()>>,
}

type Body = BoxBody<Bytes, io::Error>;

impl FakeKube {
    /// Listens on 127.0.0.1 with an OS-picked port, serving `namespace`.
    pub async fn start(namespace: &str) -> FakeKube {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let state = State {
            namespace: namespace.to_owned(),
            rv: 100,
            objects: HashMap::new(),
            history: Vec::new(),
            compacted: 0,
            drop_epoch: 0,
            drop_abrupt: false,
            expire_epoch: 0,
            bookmark_epoch: 0,
            bookmarks_sent: 0,
            failing_lists: HashMap::new(),
            held_lists: HashSet::new(),
            pages: HashMap::new(),
            next_token: 0,
            uids: 0,
            requests: Vec::new(),
            open_watches: HashMap::new(),
            closed: false,
        };
        let shared = Arc::new(Shared { state: Mutex::new(state), wake: watch::channel(0).0 });
        let server = tokio::spawn(serve(listener, shared.clone()));
        FakeKube { addr, shared, server: Some(server) }
    }

    /// Where it listens (for a kubeconfig: `server: http://{addr}`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig for this server (plain HTTP, no user, its namespace),
    /// for a `kvpick serve` child process to find it by `KUBECONFIG`.
    pub fn kubeconfig(&self) -> String {
        let namespace = self.shared.lock().namespace.clone();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: none\n    namespace: {namespace}\n\
             current-context: fake\nusers:\n- name: none\n  user: {{}}\n",
            self.addr
        )
    }

    /// A real `kube::Client` for this server: plain HTTP, no auth.
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("server url");
        let mut config = kube::Config::new(url);
        config.default_namespace = self.shared.lock().namespace.clone();
        kube::Client::try_from(config).expect("kube client")
    }

    /// Runs `f` on the state in one locked step, then wakes the watches.
    pub fn edit<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.shared.edit(f)
    }

    pub fn put(&self, kind: Kind, obj: Value) {
        self.edit(|s| s.put(kind, obj));
    }

    pub fn delete(&self, kind: Kind, name: &str) -> bool {
        self.edit(|s| s.delete(kind, name))
    }

    /// The next `n` LISTs of `kind` answer `code` (a `Status`).
    pub fn fail_next_lists(&self, kind: Kind, code: u16, n: usize) {
        self.edit(|s| s.failing_lists.entry(kind).or_default().extend(std::iter::repeat_n(code, n)));
    }

    /// LISTs of `kind` wait (the request is logged) until released.
    pub fn hold_lists(&self, kind: Kind) {
        self.edit(|s| s.held_lists.insert(kind));
    }

    pub fn release_lists(&self, kind: Kind) {
        self.edit(|s| s.held_lists.remove(&kind));
    }

    /// Requests for `kind` so far, in order.
    pub fn requests(&self, kind: Kind) -> Vec<Logged> {
        self.shared.lock().requests.iter().filter(|r| r.kind == kind).cloned().collect()
    }

    /// First-page LISTs of `kind` (a relist counts once however many pages).
    pub fn lists(&self, kind: Kind) -> usize {
        self.requests(kind).iter().filter(|r| !r.watch && !r.query.contains_key("continue")).count()
    }

    pub fn watches(&self, kind: Kind) -> usize {
        self.requests(kind).iter().filter(|r| r.watch).count()
    }

    pub fn open_watches(&self, kind: Kind) -> usize {
        self.shared.lock().open_watches.get(&kind).copied().unwrap_or(0)
    }

    pub fn bookmarks_sent(&self) -> usize {
        self.shared.lock().bookmarks_sent
    }

    /// Stops accepting, ends every watch and closes every connection.
    pub async fn shutdown(mut self) {
        self.shared.edit(|s| s.closed = true);
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.shared.edit(|s| s.closed = true);
        if let Some(server) = &self.server {
            server.abort();
        }
    }
}

/// Accepts connections until aborted; each is served by hyper's HTTP/1.1
/// (keep-alive) in a task of this one's `JoinSet`, so aborting the server
/// ends them all.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let shared = shared.clone();
        conns.spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
        while conns.try_join_next().is_some() {}
    }
}

async fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let Some((kind, ns)) = route(&path) else {
        return status(404, "NotFound", &format!("the server could not find the requested resource ({path})"));
    };
    if req.method() != Method::GET {
        return status(405, "MethodNotAllowed", "only get, list and watch are served");
    }
    let own_ns = shared.lock().namespace.clone();
    if ns != own_ns {
        return status(
            403,
            "Forbidden",
            &format!("{}s is forbidden: cannot list resource in the namespace \"{ns}\"", kind.kind().to_lowercase()),
        );
    }
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    shared.edit(|s| s.requests.push(Logged { kind, watch, query: query.clone() }));
    let selector = match Selector::parse(&query) {
        Ok(sel) => sel,
        Err(msg) => return status(400, "BadRequest", &msg),
    };
    if watch { start_watch(shared, kind, selector, &query) } else { list(shared, kind, selector, &query).await }
}

fn route(path: &str) -> Option<(Kind, String)> {
    Kind::ALL.into_iter().find_map(|kind| {
        let (prefix, plural) = kind.prefix_and_plural();
        let (ns, rest) = path.strip_prefix(prefix)?.split_once('/')?;
        (rest == plural).then(|| (kind, ns.to_owned()))
    })
}

async fn list(
    shared: &Arc<Shared>,
    kind: Kind,
    selector: Selector,
    query: &BTreeMap<String, String>,
) -> Response<Body> {
    let mut wake = shared.wake.subscribe();
    loop {
        wake.borrow_and_update();
        if !shared.lock().held_lists.contains(&kind) {
            break;
        }
        if wake.changed().await.is_err() {
            return status(503, "ServiceUnavailable", "shutting down");
        }
    }
    shared.edit(|st| {
        if let Some(code) = st.failing_lists.get_mut(&kind).and_then(VecDeque::pop_front) {
            return status(code, reason_of(code), "injected failure");
        }
        let limit = query.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
        let (rv, mut items) = match query.get("continue") {
            Some(token) => match st.pages.remove(token).filter(|p| p.kind == kind) {
                Some(page) => (page.rv, page.rest),
                None => return status(410, "Expired", "the provided continue parameter is too old"),
            },
            None => {
                let items: Vec<Value> = st
                    .objects
                    .get(&kind)
                    .into_iter()
                    .flat_map(BTreeMap::values)
                    .filter(|o| selector.matches(o))
                    .cloned()
                    .collect();
                (st.rv, items)
            }
        };
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if let Some(limit) = limit.filter(|l| items.len() > *l) {
            let rest = items.split_off(limit);
            st.next_token += 1;
            let token = format!("page-{}", st.next_token);
            metadata["remainingItemCount"] = json!(rest.len());
            metadata["continue"] = json!(token);
            st.pages.insert(token, Page { kind, rv, rest });
        }
        if !kind.items_carry_type() {
            for item in &mut items {
                if let Some(map) = item.as_object_mut() {
                    map.remove("apiVersion");
                    map.remove("kind");
                }
            }
        }
        let body = json!({
            "apiVersion": kind.api_version(),
            "kind": format!("{}List", kind.kind()),
            "metadata": metadata,
            "items": items,
        });
        json_response(200, &body)
    })
}

enum Start {
    /// No resourceVersion, or "0": the current objects as `ADDED` first.
    Now,
    From(u64),
}

fn start_watch(
    shared: &Arc<Shared>,
    kind: Kind,
    selector: Selector,
    query: &BTreeMap<String, String>,
) -> Response<Body> {
    let start = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => Start::Now,
        Some(rv) => match rv.parse() {
            Ok(rv) => Start::From(rv),
            Err(_) => return status(400, "BadRequest", &format!("invalid resourceVersion {rv:?}")),
        },
    };
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout = query.get("timeoutSeconds").and_then(|t| t.parse().ok()).map(Duration::from_secs);
    let (tx, rx) = fmpsc::channel::<Result<Frame<Bytes>, io::Error>>(64);
    let shared = shared.clone();
    tokio::spawn(async move {
        shared.edit(|s| *s.open_watches.entry(kind).or_default() += 1);
        run_watch(&shared, kind, &selector, start, bookmarks, timeout, tx).await;
        shared.edit(|s| *s.open_watches.entry(kind).or_default() -= 1);
    });
    let body = BodyExt::boxed(StreamBody::new(rx));
    let mut resp = Response::new(body);
    resp.headers_mut().insert("content-type", "application/json".parse().expect("header"));
    resp
}

enum Step {
    Send(Vec<Value>),
    End { events: Vec<Value>, abrupt: bool },
}

async fn run_watch(
    shared: &Shared,
    kind: Kind,
    selector: &Selector,
    start: Start,
    bookmarks: bool,
    timeout: Option<Duration>,
    mut tx: fmpsc::Sender<Result<Frame<Bytes>, io::Error>>,
) {
    let mut wake = shared.wake.subscribe();
    let deadline = timeout.map(|t| Instant::now() + t);
    let (mut pos, drop_epoch, expire_epoch, mut bookmark_epoch, first) = {
        let st = shared.lock();
        match start {
            Start::From(rv) if rv < st.compacted => {
                let gone = status_value(410, "Expired", &format!("too old resource version: {rv} ({})", st.compacted));
                (0, 0, 0, 0, Err(json!({ "type": "ERROR", "object": gone })))
            }
            Start::From(rv) => (rv, st.drop_epoch, st.expire_epoch, st.bookmark_epoch, Ok(Vec::new())),
            Start::Now => {
                let added = st
                    .objects
                    .get(&kind)
                    .into_iter()
                    .flat_map(BTreeMap::values)
                    .filter(|o| selector.matches(o))
                    .map(|o| json!({ "type": "ADDED", "object": o }))
                    .collect();
                (st.rv, st.drop_epoch, st.expire_epoch, st.bookmark_epoch, Ok(added))
            }
        }
    };
    let first = match first {
        Ok(events) => events,
        Err(gone) => {
            let _ = send_events(&mut tx, vec![gone]).await;
            return;
        }
    };
    if send_events(&mut tx, first).await.is_err() {
        return;
    }
    loop {
        wake.borrow_and_update();
        let step = shared.edit(|st| {
            if st.closed || st.drop_epoch != drop_epoch {
                return Step::End { events: Vec::new(), abrupt: st.closed || st.drop_abrupt };
            }
            if st.expire_epoch != expire_epoch {
                let gone = status_value(410, "Expired", "too old resource version");
                return Step::End { events: vec![json!({ "type": "ERROR", "object": gone })], abrupt: false };
            }
            let from = st.history.partition_point(|e| e.rv <= pos);
            let mut events: Vec<Value> =
                st.history[from..].iter().filter(|e| e.kind == kind).filter_map(|e| watch_event(e, selector)).collect();
            pos = st.rv;
            if bookmarks && st.bookmark_epoch != bookmark_epoch {
                bookmark_epoch = st.bookmark_epoch;
                st.bookmarks_sent += 1;
                events.push(json!({
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": kind.api_version(),
                        "kind": kind.kind(),
                        "metadata": { "resourceVersion": st.rv.to_string() },
                    },
                }));
            }
            Step::Send(events)
        });
        match step {
            Step::Send(events) => {
                if send_events(&mut tx, events).await.is_err() {
                    return;
                }
            }
            Step::End { events, abrupt } => {
                let _ = send_events(&mut tx, events).await;
                if abrupt {
                    // hyper cuts the connection without the last chunk.
                    let _ = tx.try_send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "watch cut")));
                }
                return;
            }
        }
        let timed_out = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = wake.changed() => if changed.is_err() { return },
            () = timed_out => return,
            () = tx_closed(&tx) => return,
        }
    }
}

/// Resolves when hyper dropped the body (the client went away).
async fn tx_closed(tx: &fmpsc::Sender<Result<Frame<Bytes>, io::Error>>) {
    let mut tx = tx.clone();
    std::future::poll_fn(|cx| match tx.poll_ready(cx) {
        std::task::Poll::Ready(Err(_)) => std::task::Poll::Ready(()),
        _ => std::task::Poll::Pending,
    })
    .await
}

async fn send_events(tx: &mut fmpsc::Sender<Result<Frame<Bytes>, io::Error>>, events: Vec<Value>) -> Result<(), ()> {
    use futures::SinkExt;
    for event in events {
        let mut line = serde_json::to_vec(&event).map_err(|_| ())?;
        line.push(b'\n');
        tx.send(Ok(Frame::data(Bytes::from(line)))).await.map_err(|_| ())?;
    }
    Ok(())
}

/// What a watch with `selector` sees of a history entry, as the watch cache
/// filters it: entering the selector is `ADDED`, leaving it `DELETED`.
fn watch_event(e: &Entry, selector: &Selector) -> Option<Value> {
    let was = e.old.as_ref().is_some_and(|o| selector.matches(o));
    let is = selector.matches(&e.new);
    let kind = match (e.deleted, was, is) {
        (true, true, _) => "DELETED",
        (true, false, _) => return None,
        (false, false, true) => "ADDED",
        (false, true, true) => "MODIFIED",
        (false, true, false) => "DELETED",
        (false, false, false) => return None,
    };
    Some(json!({ "type": kind, "object": e.new }))
}

/// Equality-based label and field selectors.
#[derive(Default)]
struct Selector {
    labels: Vec<(String, Op)>,
    fields: Vec<(String, String, bool)>,
}

enum Op {
    Eq(String),
    Ne(String),
    Exists,
    Absent,
}

impl Selector {
    fn parse(query: &BTreeMap<String, String>) -> Result<Selector, String> {
        let mut sel = Selector::default();
        for term in query.get("labelSelector").map(String::as_str).unwrap_or("").split(',').filter(|t| !t.is_empty()) {
            let term = term.trim();
            let parsed = if let Some((k, v)) = term.split_once("!=") {
                (k, Op::Ne(v.to_owned()))
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k, Op::Eq(v.to_owned()))
            } else if let Some(k) = term.strip_prefix('!') {
                (k, Op::Absent)
            } else {
                (term, Op::Exists)
            };
            sel.labels.push((parsed.0.trim().to_owned(), parsed.1));
        }
        for term in query.get("fieldSelector").map(String::as_str).unwrap_or("").split(',').filter(|t| !t.is_empty()) {
            let (field, value, eq) = match term.split_once("!=") {
                Some((f, v)) => (f, v, false),
                None => match term.split_once("==").or_else(|| term.split_once('=')) {
                    Some((f, v)) => (f, v, true),
                    None => return Err(format!("invalid field selector term {term:?}")),
                },
            };
            if field != "metadata.name" && field != "metadata.namespace" {
                return Err(format!("field label not supported: {field}"));
            }
            sel.fields.push((field.to_owned(), value.to_owned(), eq));
        }
        Ok(sel)
    }

    fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let labels_ok = self.labels.iter().all(|(k, op)| {
            let v = labels.get(k).and_then(Value::as_str);
            match op {
                Op::Eq(want) => v == Some(want.as_str()),
                Op::Ne(want) => v != Some(want.as_str()),
                Op::Exists => v.is_some(),
                Op::Absent => v.is_none(),
            }
        });
        let fields_ok = self.fields.iter().all(|(field, want, eq)| {
            let key = field.trim_start_matches("metadata.");
            (obj["metadata"][key].as_str() == Some(want.as_str())) == *eq
        });
        labels_ok && fields_ok
    }
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        410 => "Expired",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn status_value(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(code, &status_value(code, reason, message))
}

fn json_response(code: u16, body: &Value) -> Response<Body> {
    let bytes = Bytes::from(serde_json::to_vec(body).expect("json"));
    let mut resp = Response::new(Full::new(bytes).map_err(|never| match never {}).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert("content-type", "application/json".parse().expect("header"));
    resp
}

/// Test objects.
pub mod objects {
    use serde_json::{Value, json};

    fn labels(pairs: &[(&str, &str)]) -> Value {
        Value::Object(pairs.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect())
    }

    /// A pod with `labels`, pod IP `ip`, condition Ready = `ready`.
    pub fn pod(name: &str, pairs: &[(&str, &str)], ip: Option<&str>, ready: bool) -> Value {
        let mut status = json!({
            "phase": if ready { "Running" } else { "Pending" },
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": if ready { "True" } else { "False" }},
            ],
        });
        if let Some(ip) = ip {
            status["podIP"] = json!(ip);
            status["podIPs"] = json!([{ "ip": ip }]);
        }
        json!({
            "metadata": {"name": name, "labels": labels(pairs)},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            "status": status,
        })
    }

    /// The same pod, being deleted (graceful termination).
    pub fn terminating(mut pod: Value) -> Value {
        pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:05:00Z");
        pod["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        pod
    }

    /// An InferencePool v1.
    pub fn pool(name: &str, selector: &[(&str, &str)], ports: &[u16]) -> Value {
        json!({
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": labels(selector)},
                "targetPorts": ports.iter().map(|p| json!({"number": p})).collect::<Vec<_>>(),
                "endpointPickerRef": {"name": "kvpick", "port": {"number": 9002}, "failureMode": "FailClose"},
            },
        })
    }

    /// An EndpointSlice of Service `service`: `(address, ready)` per endpoint
    /// (`None` leaves the condition unset), with the named ports.
    pub fn slice(name: &str, service: &str, endpoints: &[(&str, Option<bool>)], ports: &[(&str, u16)]) -> Value {
        let endpoints: Vec<Value> = endpoints
            .iter()
            .map(|(addr, ready)| {
                let mut ep = json!({"addresses": [addr]});
                if let Some(ready) = ready {
                    ep["conditions"] = json!({"ready": ready, "serving": ready, "terminating": false});
                }
                ep
            })
            .collect();
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
        })
    }
}
