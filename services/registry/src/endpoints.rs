//! The registry's router: every endpoint in one table ([`ROUTES`]: its group and subject, its
//! name, the handler that answers it, who reaches it and how it is traced), added to the micro
//! service by one loop, and each request handed to its handler and answered.

use std::sync::Arc;
use std::time::Instant;

use async_nats::service::{Request, Service};
use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::names::{
    BACKFILL_CANCEL, BACKFILL_LIST, BACKFILL_START, BACKFILL_STATUS, CANCEL_ENDPOINT, CANCEL_TASK_ENDPOINT,
    Names,
};

use crate::backfills::{BackfillApi, BackfillEndpoint};
use crate::breakers::{BreakerApi, BreakerEndpoint};
use crate::calendars::{CalendarApi, CalendarEndpoint};
use crate::cancel::{CancelApi, CancelEndpoint};
use crate::codec::{self, Limits, TaskEndpoint};
use crate::concurrency::{ConcurrencyApi, LimitEndpoint};
use crate::dlq::{DlqApi, DlqEndpoint};
use crate::history::EventHistory;
use crate::metrics::Metrics;
use crate::queues::{QueueApi, QueueEndpoint};
use crate::spans::{self, Tracing};
use crate::tasks::TaskStore;
use crate::{api, runs};

/// The handler that answers an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// A task endpoint, served by [`crate::api`].
    Task(TaskEndpoint),
    /// A dead-letter endpoint, served by [`crate::dlq`].
    Dlq(DlqEndpoint),
    /// A breaker endpoint, served by [`crate::breakers`].
    Breaker(BreakerEndpoint),
    /// A calendar endpoint, served by [`crate::calendars`].
    Calendar(CalendarEndpoint),
    /// A queue endpoint, served by [`crate::queues`].
    Queue(QueueEndpoint),
    /// A limits endpoint, served by [`crate::concurrency`].
    Limit(LimitEndpoint),
    /// Reading a run record, served by [`crate::runs`].
    RunsGet,
    /// Cancelling runs, served by [`crate::cancel`].
    Cancel(CancelEndpoint),
    /// A namespace's event history, served by [`crate::history`].
    EventsHistory,
    /// A backfill endpoint, served by [`crate::backfills`].
    Backfill(BackfillEndpoint),
    /// Anything else under `<prefix>.api.>`: answered `unknown_endpoint`.
    Unknown,
}

/// The subject group of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// `<prefix>.api.task`.
    Task,
    /// `<prefix>.api.dlq`.
    Dlq,
    /// `<prefix>.api.breaker`.
    Breaker,
    /// `<prefix>.api.calendar`.
    Calendar,
    /// `<prefix>.api.queue`.
    Queue,
    /// `<prefix>.api.limits`.
    Limits,
    /// `<prefix>.api.runs`.
    Runs,
    /// `<prefix>.api.events`.
    Events,
    /// `<prefix>.api.backfill`.
    Backfill,
    /// `<prefix>.api.>`: every API subject (the catch-all).
    Api,
}

impl Group {
    fn subject(self, names: &Names) -> String {
        match self {
            Group::Task => names.task_api_group(),
            Group::Dlq => names.dlq_api_group(),
            Group::Breaker => names.breaker_api_group(),
            Group::Calendar => names.calendar_api_group(),
            Group::Queue => names.queue_api_group(),
            Group::Limits => names.limits_api_group(),
            Group::Runs => names.runs_api_group(),
            Group::Events => names.events_api_group(),
            Group::Backfill => names.backfill_api_group(),
            Group::Api => names.api_wildcard(),
        }
    }
}

/// On which subjects an endpoint is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// `<group>.<subject>` for administrators and `<group>.<subject>.<namespace>` (named
    /// `<name>-ns`) for teams confined to one namespace by NATS permissions.
    Both,
    /// `<group>.<subject>` only: administrators (breakers and queues span namespaces).
    Admin,
    /// `<group>.<subject>.<namespace>` only: administrators read the bucket or stream directly.
    Namespaced,
    /// Every API subject no endpoint owns, in a queue group of its own: within one group NATS
    /// delivers a message to only one of the matching subscriptions, and the catch-all must not
    /// steal requests from endpoints.
    Rest,
}

impl Reach {
    /// The forms served: plain (`false`) and namespaced (`true`).
    fn forms(self) -> &'static [bool] {
        match self {
            Reach::Both => &[false, true],
            Reach::Admin | Reach::Rest => &[false],
            Reach::Namespaced => &[true],
        }
    }
}

/// One row of the endpoint table.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) group: Group,
    /// The subject within the group.
    pub(crate) subject: &'static str,
    /// The micro-service endpoint name and the metrics label.
    pub(crate) name: &'static str,
    pub(crate) endpoint: Endpoint,
    pub(crate) reach: Reach,
    pub(crate) tracing: Tracing,
}

/// Every endpoint of the registry, in registration order.
#[rustfmt::skip]
pub(crate) static ROUTES: [Route; 35] = {
    use {BackfillEndpoint as F, BreakerEndpoint as B, CalendarEndpoint as K, CancelEndpoint as C, DlqEndpoint as D, Endpoint as E, Group as G, LimitEndpoint as L, QueueEndpoint as Q, Reach as R, TaskEndpoint as T};
    const fn row(group: Group, subject: &'static str, name: &'static str, endpoint: Endpoint, reach: Reach, tracing: Tracing) -> Route {
        Route { group, subject, name, endpoint, reach, tracing }
    }
    [
        //   group      subject    name              handler               reach          tracing
        row(G::Task,    "put",     "put",            E::Task(T::Put),      R::Both,       Tracing::Span("put")),
        row(G::Task,    "get",     "get",            E::Task(T::Get),      R::Both,       Tracing::None),
        row(G::Task,    "list",    "list",           E::Task(T::List),     R::Both,       Tracing::None),
        row(G::Task,    "delete",  "delete",         E::Task(T::Delete),   R::Both,       Tracing::Span("delete")),
        row(G::Task,    "pause",   "pause",          E::Task(T::Pause),    R::Both,       Tracing::Span("pause")),
        row(G::Task,    "resume",  "resume",         E::Task(T::Resume),   R::Both,       Tracing::Span("resume")),
        row(G::Task,    "trigger", "trigger",        E::Task(T::Trigger),  R::Both,       Tracing::Dispatch("trigger")),
        row(G::Task,    "next",    "next",           E::Task(T::Next),     R::Both,       Tracing::None),
        row(G::Task,    "graph",   "graph",          E::Task(T::Graph),    R::Both,       Tracing::None),
        row(G::Dlq,     "list",    "dlq-list",       E::Dlq(D::List),      R::Both,       Tracing::None),
        row(G::Dlq,     "get",     "dlq-get",        E::Dlq(D::Get),       R::Both,       Tracing::None),
        row(G::Dlq,     "replay",  "dlq-replay",     E::Dlq(D::Replay),    R::Both,       Tracing::Dispatch("dlq replay")),
        row(G::Dlq,     "purge",   "dlq-purge",      E::Dlq(D::Purge),     R::Both,       Tracing::None),
        row(G::Breaker, "list",    "breaker-list",   E::Breaker(B::List),  R::Admin,      Tracing::None),
        row(G::Breaker, "get",     "breaker-get",    E::Breaker(B::Get),   R::Admin,      Tracing::None),
        row(G::Breaker, "reset",   "breaker-reset",  E::Breaker(B::Reset), R::Admin,      Tracing::None),
        row(G::Calendar, "put",    "calendar-put",   E::Calendar(K::Put),  R::Both,       Tracing::None),
        row(G::Calendar, "get",    "calendar-get",   E::Calendar(K::Get),  R::Both,       Tracing::None),
        row(G::Calendar, "list",   "calendar-list",  E::Calendar(K::List), R::Both,       Tracing::None),
        row(G::Calendar, "delete", "calendar-delete", E::Calendar(K::Delete), R::Both,    Tracing::None),
        row(G::Queue,   "list",    "queue-list",     E::Queue(Q::List),    R::Admin,      Tracing::None),
        row(G::Queue,   "pause",   "queue-pause",    E::Queue(Q::Pause),   R::Admin,      Tracing::None),
        row(G::Queue,   "resume",  "queue-resume",   E::Queue(Q::Resume),  R::Admin,      Tracing::None),
        row(G::Limits,  "list",    "limits-list",    E::Limit(L::List),    R::Admin,      Tracing::None),
        row(G::Limits,  "set",     "limits-set",     E::Limit(L::Set),     R::Admin,      Tracing::None),
        row(G::Limits,  "clear",   "limits-clear",   E::Limit(L::Clear),   R::Admin,      Tracing::None),
        row(G::Runs,    "get",     "runs-get",       E::RunsGet,           R::Namespaced, Tracing::None),
        row(G::Runs,    CANCEL_ENDPOINT, "runs-cancel", E::Cancel(C::Run), R::Namespaced, Tracing::Span("cancel")),
        row(G::Runs,    CANCEL_TASK_ENDPOINT, "runs-cancel-task", E::Cancel(C::Task), R::Namespaced, Tracing::Span("cancel task")),
        row(G::Events,  "history", "events-history", E::EventsHistory,     R::Namespaced, Tracing::None),
        row(G::Backfill, BACKFILL_START,  "backfill-start",  E::Backfill(F::Start),  R::Both, Tracing::Span("backfill start")),
        row(G::Backfill, BACKFILL_STATUS, "backfill-status", E::Backfill(F::Status), R::Both, Tracing::None),
        row(G::Backfill, BACKFILL_LIST,   "backfill-list",   E::Backfill(F::List),   R::Both, Tracing::None),
        row(G::Backfill, BACKFILL_CANCEL, "backfill-cancel", E::Backfill(F::Cancel), R::Both, Tracing::Span("backfill cancel")),
        row(G::Api,     "",        "unknown",        E::Unknown,           R::Rest,       Tracing::None),
    ]
};

/// A request, the row of its endpoint, and whether it came on a namespaced subject
/// (`<group>.<endpoint>.<namespace>`, the namespace being the subject's last token).
pub(crate) type Routed = (&'static Route, bool, Request);

/// Every endpoint's requests, as they come.
pub(crate) type Requests = SelectAll<BoxStream<'static, Routed>>;

/// Adds every endpoint of [`ROUTES`] to `service`.
pub(crate) async fn add(service: &Service, names: &Names) -> anyhow::Result<Requests> {
    let mut requests = Requests::new();
    for route in &ROUTES {
        for &namespaced in route.reach.forms() {
            requests.push(route.add(service, names, namespaced).await?);
        }
    }
    Ok(requests)
}

impl Route {
    /// The subject an endpoint is served on (`*` for the namespace of a namespaced form), and
    /// its micro-service name.
    fn served(&self, names: &Names, namespaced: bool) -> (String, String) {
        let group = self.group.subject(names);
        match (self.reach, namespaced) {
            (Reach::Rest, _) => (group, self.name.to_string()),
            (_, false) => (format!("{group}.{}", self.subject), self.name.to_string()),
            (Reach::Both, true) => (format!("{group}.{}.*", self.subject), format!("{}-ns", self.name)),
            (_, true) => (format!("{group}.{}.*", self.subject), self.name.to_string()),
        }
    }

    /// Adds one form of the endpoint to `service`: its requests.
    async fn add(
        &'static self,
        service: &Service,
        names: &Names,
        namespaced: bool,
    ) -> anyhow::Result<BoxStream<'static, Routed>> {
        let (subject, name) = self.served(names, namespaced);
        let builder = service.endpoint_builder().name(name);
        let builder = match self.reach {
            Reach::Rest => builder.queue_group("unknown-endpoint"),
            _ => builder.metadata([("namespaced".to_string(), namespaced.to_string())].into()),
        };
        let endpoint = builder
            .add(&subject)
            .await
            .map_err(|e| anyhow::Error::from_boxed(e).context(format!("add endpoint {subject}")))?;
        let requests = endpoint.map(move |request| (self, namespaced, request));
        if self.reach != Reach::Rest {
            return Ok(requests.boxed());
        }
        // The catch-all sees every API request too: it answers only those no endpoint owns.
        let owned = Owned::of(names);
        Ok(requests
            .filter(move |(_, _, request)| std::future::ready(!owned.owns(&request.message.subject)))
            .boxed())
    }
}

/// The subjects the endpoints own, for the catch-all to leave alone.
struct Owned {
    /// Plain subjects (`<group>.<subject>`).
    plain: Vec<String>,
    /// Subjects owned with any last token after them (`<group>.<subject>.<namespace>`).
    namespaced: Vec<String>,
}

impl Owned {
    fn of(names: &Names) -> Owned {
        let routes = || ROUTES.iter().filter(|route| route.reach != Reach::Rest);
        let subject = |route: &Route| format!("{}.{}", route.group.subject(names), route.subject);
        Owned {
            plain: routes().filter(|route| route.reach.forms().contains(&false)).map(subject).collect(),
            // As before the table: a breaker subject with a namespace after it is owned too.
            namespaced: routes().map(subject).collect(),
        }
    }

    fn owns(&self, subject: &str) -> bool {
        let namespaced = subject
            .rsplit_once('.')
            .is_some_and(|(endpoint, _)| self.namespaced.iter().any(|owned| owned == endpoint));
        namespaced || self.plain.iter().any(|owned| owned == subject)
    }
}

/// What the endpoints read and write.
pub(crate) struct Handlers {
    pub(crate) store: TaskStore,
    pub(crate) dlq: DlqApi,
    pub(crate) breakers: BreakerApi,
    pub(crate) calendars: CalendarApi,
    pub(crate) queues: QueueApi,
    pub(crate) concurrency: ConcurrencyApi,
    pub(crate) runs: async_nats::jetstream::kv::Store,
    pub(crate) cancels: CancelApi,
    pub(crate) history: EventHistory,
    pub(crate) backfills: BackfillApi,
    pub(crate) limits: Limits,
}

/// Answers one request with its handler's reply or its error reply, counted and timed.
pub(crate) async fn serve(handlers: Arc<Handlers>, metrics: &Metrics, (route, namespaced, request): Routed) {
    let Handlers {
        store,
        dlq,
        breakers,
        calendars,
        queues,
        concurrency,
        runs,
        cancels,
        history,
        backfills,
        limits,
    } = &*handlers;
    let started = Instant::now();
    let message = &request.message;
    let scope = namespaced.then(|| message.subject.rsplit_once('.').map_or("", |(_, namespace)| namespace));
    let span = spans::request(route.tracing, &message.subject, message.headers.as_ref());
    let payload = &message.payload;
    // Each endpoint's future is boxed at its own size: inline, the largest (kilobytes) would
    // be part of the task spawned for every request, whatever its endpoint.
    let handling = async {
        match route.endpoint {
            Endpoint::Task(endpoint) => Box::pin(api::handle(store, *limits, endpoint, scope, message)).await,
            Endpoint::Dlq(endpoint) => Box::pin(dlq.handle(endpoint, scope, payload)).await,
            Endpoint::Breaker(endpoint) => Box::pin(breakers.handle(endpoint, payload)).await,
            Endpoint::Calendar(endpoint) => {
                let headers = message.headers.as_ref();
                Box::pin(calendars.handle(endpoint, scope, *limits, payload, headers)).await
            }
            Endpoint::Queue(endpoint) => Box::pin(queues.handle(endpoint, payload)).await,
            Endpoint::Limit(endpoint) => Box::pin(concurrency.handle(endpoint, payload)).await,
            Endpoint::RunsGet => Box::pin(runs::get(runs, scope.unwrap_or_default(), payload)).await,
            Endpoint::Cancel(endpoint) => {
                Box::pin(cancels.handle(endpoint, scope.unwrap_or_default(), payload)).await
            }
            Endpoint::EventsHistory => Box::pin(history.handle(scope.unwrap_or_default(), payload)).await,
            Endpoint::Backfill(endpoint) => Box::pin(backfills.handle(endpoint, scope, payload)).await,
            Endpoint::Unknown => Err(ApiError::new(
                ErrorCode::UnknownEndpoint,
                format!("no endpoint {}; see `nats micro info` for the endpoints", message.subject),
            )
            .into()),
        }
    };
    let result = span.around(handling).await;
    let outcome = result.as_ref().map_or_else(|failure| failure.code().as_str(), |_| "ok");
    metrics.requests.with_label_values(&[route.name, outcome]).inc();
    metrics.request_seconds.with_label_values(&[route.name]).observe(started.elapsed().as_secs_f64());
    let sent = match result {
        Ok(body) => request.respond(Ok(body.into())).await,
        Err(failure) => {
            let errors = failure.wire();
            if failure.code() == ErrorCode::Internal {
                tracing::error!(endpoint = route.name, error = %errors, "request failed");
            }
            let (body, headers) = codec::error_reply(&errors);
            request.respond_with_headers(Ok(body.into()), headers).await
        }
    };
    if let Err(error) = sent {
        tracing::debug!(%error, endpoint = route.name, "reply not sent (requester gone?)");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_endpoint_has_its_own_name_and_subject() {
        let names = Names::default();
        let mut seen_names = HashSet::new();
        let mut seen_subjects = HashSet::new();
        for route in &ROUTES {
            for &namespaced in route.reach.forms() {
                let (subject, name) = route.served(&names, namespaced);
                assert!(seen_names.insert(name.clone()), "{name} twice");
                assert!(seen_subjects.insert(subject.clone()), "{subject} twice");
            }
        }
        assert_eq!(ROUTES.iter().filter(|route| route.reach == Reach::Rest).count(), 1);
        assert!(seen_names.contains("dlq-replay-ns") && seen_names.contains("runs-get"));
        assert!(seen_subjects.contains(&names.runs_api_namespaced("get", "*")));
    }

    #[test]
    fn the_catch_all_leaves_alone_what_the_endpoints_own() {
        let names = Names::default();
        let owned = Owned::of(&names);
        for subject in [
            names.task_api_subject("put"),
            format!("{}.demo", names.task_api_subject("put")),
            names.dlq_api_subject("replay"),
            names.breaker_api_subject("reset"),
            names.queue_api_subject("pause"),
            names.calendar_api_subject("put"),
            names.calendar_api_namespaced("delete", "demo"),
            names.runs_api_namespaced("get", "demo"),
            names.runs_api_namespaced(CANCEL_ENDPOINT, "demo"),
            names.runs_api_namespaced(CANCEL_TASK_ENDPOINT, "demo"),
            names.events_api_namespaced("history", "demo"),
            names.backfill_api_subject(BACKFILL_START),
            names.backfill_api_namespaced(BACKFILL_CANCEL, "demo"),
        ] {
            assert!(owned.owns(&subject), "{subject}");
        }
        for subject in [
            names.task_api_subject("bogus"),
            format!("{}.get", names.runs_api_group()),
            format!("{}.history", names.events_api_group()),
        ] {
            assert!(!owned.owns(&subject), "{subject}");
        }
    }
}
