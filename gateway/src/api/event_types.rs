//! The event catalog: event types with JSON Schemas (draft 2020-12, numbered versions)
//! and examples. The operator's catalog (`/v1/event-types`, admin) is inherited by every
//! tenant; a tenant's own type (`/v1/tenants/{tenant}/event-types`, `read` to read,
//! `manage` to write) overrides the operator's of the same name. A tenant's
//! `schema_validation` (`/v1/tenants/{tenant}/catalog`) says what intake does with events
//! that fail it. Every write refreshes this node's `catalog::Catalog`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Admin, JsonBody, Manage, Path, Query, Read, TenantAuth, TenantPath};
use super::{ApiError, AppState, rfc3339};
use crate::catalog;
use crate::model::{
    Adapter, CatalogOwner, EndpointState, EventType, OPS_TENANT, SchemaValidation, TenantId, TenantSettings,
    validate_event_type,
};
use crate::spec::{MAX_DESCRIPTION, check_text};
use crate::store::EndpointChange;

/// How many examples a type keeps.
const MAX_EXAMPLES: usize = 20;
/// The largest schema, as JSON text.
const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// The path of the export, which no type can be named.
const EXPORT: &str = "openapi.json";

/// An event type as posted (create: `name` required) or patched (every field optional).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventTypeIn {
    /// The type events are posted with (`invoice.paid`): 1-128 of letters, digits, `.`,
    /// `_`, `-`, `:`. Set at creation only.
    name: Option<String>,
    description: Option<String>,
    /// Still accepted by intake; shown as deprecated in the catalog and its export.
    deprecated: Option<bool>,
    /// Example payloads, each valid against the schema. Replaces the stored list.
    #[schema(value_type = Option<Vec<serde_json::Value>>)]
    examples: Option<Vec<serde_json::Value>>,
    /// The payload's JSON Schema (draft 2020-12; local `$ref`s only; `format` is
    /// asserted). One that differs from the latest version is stored as the next version;
    /// older versions stay readable.
    #[schema(value_type = Option<Object>)]
    schema: Option<serde_json::Value>,
    /// The plugins that convert a payload to an older version of the schema, for endpoints
    /// that pin one (`payload_versions`): each `{"from": 2, "to": 1, "plugin": "…"}`, a
    /// plugin with a `transform` hook (the tenant's own; on an operator type, one of the
    /// operator's tenant `herald-ops`). Chained when several steps are needed. Replaces the
    /// stored list; endpoints held for a missing adapter of this type resume.
    adapters: Option<Vec<Adapter>>,
}

/// An event type with its latest schema.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventTypeOut {
    name: String,
    description: String,
    deprecated: bool,
    #[schema(value_type = Vec<serde_json::Value>)]
    examples: Vec<serde_json::Value>,
    /// The latest schema's version (1, 2, …); 0 while the type has no schema.
    version: i64,
    #[schema(value_type = Option<Object>)]
    schema: Option<serde_json::Value>,
    /// The plugins that convert a payload of one version to an older one.
    adapters: Vec<Adapter>,
    /// `tenant` (the tenant's own) or `operator` (inherited from the operator's catalog).
    source: &'static str,
    /// RFC 3339.
    created_at: String,
    /// RFC 3339.
    updated_at: String,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct EventTypeList {
    data: Vec<EventTypeOut>,
}

/// One version of a type's schema.
#[derive(Serialize, ToSchema)]
pub(crate) struct SchemaVersionOut {
    version: i64,
    #[schema(value_type = Object)]
    schema: serde_json::Value,
    /// RFC 3339.
    created_at: String,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct SchemaVersionList {
    /// Oldest first.
    data: Vec<SchemaVersionOut>,
}

/// A tenant's settings.
#[derive(Serialize, ToSchema)]
pub(crate) struct CatalogSettings {
    /// What intake (the events API and the outbox relay) does with an event whose payload
    /// fails its type's schema, or whose type is missing from a catalog the tenant has:
    /// `off` (the default) checks nothing, `warn` accepts and counts it
    /// (`herald_schema_violations_total`), `enforce` refuses it with a 422.
    schema_validation: SchemaValidation,
    /// Verified endpoints for the whole tenant: an HTTP endpoint created, or given a new
    /// `url`, without a `verify` of its own gets `verify: true` (nothing is delivered until
    /// its URL echoes a signed challenge). An endpoint's own `verify` wins. Default `false`.
    verify_endpoints: bool,
}

/// A tenant's settings as written: each field written replaces its own, one omitted stays.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CatalogSettingsIn {
    /// See `CatalogSettings`.
    schema_validation: Option<SchemaValidation>,
    /// See `CatalogSettings`.
    verify_endpoints: Option<bool>,
}

impl From<TenantSettings> for CatalogSettings {
    fn from(s: TenantSettings) -> CatalogSettings {
        CatalogSettings { schema_validation: s.schema_validation, verify_endpoints: s.verify_endpoints }
    }
}

/// `{tenant}` and `{name}`: one event type as the tenant sees it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct TypePath {
    /// The tenant's id.
    #[allow(dead_code)] // `TenantAuth` reads it; here for the document.
    tenant: String,
    /// The event type's name.
    name: String,
}

/// `{name}`: one event type of the operator's catalog.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct OperatorTypePath {
    /// The event type's name.
    name: String,
}

fn view(t: EventType) -> EventTypeOut {
    EventTypeOut {
        source: match t.owner {
            CatalogOwner::Operator => "operator",
            CatalogOwner::Tenant(_) => "tenant",
        },
        name: t.name,
        description: t.description,
        deprecated: t.deprecated,
        examples: t.examples,
        version: t.version,
        schema: t.schema,
        adapters: t.adapters,
        created_at: rfc3339(t.created_at),
        updated_at: rfc3339(t.updated_at),
    }
}

// ---- the tenant's view ----

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/event-types", tag = "event-types", operation_id = "create_event_type",
    params(TenantPath), request_body = EventTypeIn,
    responses(
        (status = 201, description = "Created (its schema, if any, as version 1)", body = EventTypeOut),
        (status = 409, description = "`conflict`: the tenant has a type of this name", body = super::doc::ErrorBody),
        (status = 422, description = "`invalid_request`: a bad name, schema or example (the message names the field)", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    JsonBody(input): JsonBody<EventTypeIn>,
) -> Result<(StatusCode, Json<EventTypeOut>), ApiError> {
    let t = insert(&state, CatalogOwner::Tenant(tenant), input).await?;
    Ok((StatusCode::CREATED, Json(view(t))))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/event-types", tag = "event-types", operation_id = "list_event_types",
    params(TenantPath),
    responses((status = 200, description = "The tenant's own types and the operator's it inherits, by name", body = EventTypeList)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
) -> Result<Json<EventTypeList>, ApiError> {
    let data = tenant_types(&state, &tenant).await?.into_iter().map(view).collect();
    Ok(Json(EventTypeList { data }))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/event-types/{name}", tag = "event-types", operation_id = "get_event_type",
    params(TypePath),
    responses((status = 200, description = "The tenant's own type of this name, else the operator's", body = EventTypeOut)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path(TypePath { name, .. }): Path<TypePath>,
) -> Result<Json<EventTypeOut>, ApiError> {
    Ok(Json(view(seen_by(&state, &tenant, &name).await?)))
}

#[utoipa::path(
    patch, path = "/v1/tenants/{tenant}/event-types/{name}", tag = "event-types", operation_id = "patch_event_type",
    params(TypePath), request_body = EventTypeIn,
    responses(
        (status = 200, description = "Changed; a new schema is stored as the next version", body = EventTypeOut),
        (status = 404, description = "`not_found`: the tenant has no own type of this name (an inherited one is changed by creating the tenant's own)", body = super::doc::ErrorBody),
        (status = 409, description = "`conflict`: another write changed its schema meanwhile", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn patch(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(TypePath { name, .. }): Path<TypePath>,
    JsonBody(input): JsonBody<EventTypeIn>,
) -> Result<Json<EventTypeOut>, ApiError> {
    Ok(Json(view(update(&state, CatalogOwner::Tenant(tenant), &name, input).await?)))
}

#[utoipa::path(
    delete, path = "/v1/tenants/{tenant}/event-types/{name}", tag = "event-types", operation_id = "delete_event_type",
    params(TypePath),
    responses((status = 204, description = "Deleted with every version of its schema (an operator type of the same name shows again)")),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(TypePath { name, .. }): Path<TypePath>,
) -> Result<StatusCode, ApiError> {
    remove(&state, CatalogOwner::Tenant(tenant), &name).await
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/event-types/{name}/versions", tag = "event-types", operation_id = "list_event_type_versions",
    params(TypePath),
    responses((status = 200, description = "Every version of the type's schema, oldest first", body = SchemaVersionList)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn versions(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path(TypePath { name, .. }): Path<TypePath>,
) -> Result<Json<SchemaVersionList>, ApiError> {
    let t = seen_by(&state, &tenant, &name).await?;
    versions_of(&state, &t.owner, &name).await
}

/// `?endpoint=`: the export as one endpoint receives it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportQuery {
    /// An endpoint of the tenant: each type it pins (`payload_versions`) shows the pinned
    /// version of its schema as `data`, and no examples (they are of the latest version).
    endpoint: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/event-types/openapi.json", tag = "event-types", operation_id = "export_event_types",
    params(TenantPath, ExportQuery),
    responses(
        (status = 200, description = "An OpenAPI 3.1 document whose `webhooks` has every type the tenant sees: the default envelope with the latest schema (or the endpoint's pinned one) as `data`, its version as `x-herald-schema-version`, and the examples", body = Object),
        (status = 404, description = "`not_found`: the tenant has no such endpoint", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn export(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Query(q): Query<ExportQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = &auth.tenant;
    let mut types = tenant_types(&state, tenant).await?;
    let version = state.store.catalog_revision().await?.to_string();
    let mut title = format!("{tenant} webhooks");
    if let Some(id) = q.endpoint {
        let endpoint = state.store.endpoint(&crate::model::EndpointId::from_stored(id)).await?;
        // A portal session limited to some endpoints sees no other's.
        let seen = endpoint.filter(|e| e.tenant == *tenant && auth.sees(&e.id));
        let endpoint = seen.ok_or_else(|| ApiError::not_found("endpoint"))?;
        pinned(&state, &mut types, &endpoint.spec.payload_versions).await?;
        title = format!("{tenant} webhooks for endpoint {}", endpoint.id);
    }
    Ok(Json(catalog::openapi(&title, &version, &types)))
}

/// Puts the pinned version's schema in place of the latest, for each type pinned.
async fn pinned(
    state: &AppState,
    types: &mut [EventType],
    pins: &std::collections::BTreeMap<String, i64>,
) -> Result<(), ApiError> {
    for t in types.iter_mut() {
        let Some(pin) = pins.get(&t.name).filter(|pin| **pin < t.version) else { continue };
        let versions = state.store.schema_versions(&t.owner, &t.name).await?;
        if let Some(v) = versions.into_iter().find(|v| v.version == *pin) {
            (t.version, t.schema, t.examples) = (v.version, Some(v.schema), vec![]);
        }
    }
    Ok(())
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/catalog", tag = "event-types", operation_id = "get_catalog_settings",
    params(TenantPath),
    responses((status = 200, description = "The tenant's catalog settings", body = CatalogSettings)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_settings(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
) -> Result<Json<CatalogSettings>, ApiError> {
    Ok(Json(stored_settings(&state, &tenant).await?.into()))
}

#[utoipa::path(
    put, path = "/v1/tenants/{tenant}/catalog", tag = "event-types", operation_id = "put_catalog_settings",
    params(TenantPath), request_body = CatalogSettingsIn,
    responses((status = 200, description = "Stored; intake and endpoint writes apply it from now on (other nodes within a second)", body = CatalogSettings)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn put_settings(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    JsonBody(input): JsonBody<CatalogSettingsIn>,
) -> Result<Json<CatalogSettings>, ApiError> {
    let stored = stored_settings(&state, &tenant).await?;
    let settings = TenantSettings {
        schema_validation: input.schema_validation.unwrap_or(stored.schema_validation),
        verify_endpoints: input.verify_endpoints.unwrap_or(stored.verify_endpoints),
    };
    state.store.put_tenant_settings(&tenant, settings, state.clock.now()).await?;
    state.catalog.refresh(&state.store).await?;
    Ok(Json(settings.into()))
}

/// The tenant's settings as stored (the defaults when never set): read from the store, not
/// the cache, so a write patches what is there.
async fn stored_settings(state: &AppState, tenant: &TenantId) -> Result<TenantSettings, ApiError> {
    let stored = state.store.tenant_settings().await?;
    Ok(stored.into_iter().find(|(t, _)| t == tenant).map(|(_, s)| s).unwrap_or_default())
}

// ---- the operator's catalog ----

#[utoipa::path(
    post, path = "/v1/event-types", tag = "event-types", operation_id = "create_operator_event_type",
    request_body = EventTypeIn,
    responses(
        (status = 201, description = "Created in the operator's catalog, which every tenant inherits", body = EventTypeOut),
        (status = 409, description = "`conflict`: the operator's catalog has a type of this name", body = super::doc::ErrorBody),
        (status = 422, description = "`invalid_request`: a bad name, schema or example (the message names the field)", body = super::doc::ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn create_operator(
    State(state): State<Arc<AppState>>,
    _: Admin,
    JsonBody(input): JsonBody<EventTypeIn>,
) -> Result<(StatusCode, Json<EventTypeOut>), ApiError> {
    let t = insert(&state, CatalogOwner::Operator, input).await?;
    Ok((StatusCode::CREATED, Json(view(t))))
}

#[utoipa::path(
    get, path = "/v1/event-types", tag = "event-types", operation_id = "list_operator_event_types",
    responses((status = 200, description = "The operator's catalog, by name", body = EventTypeList)),
    security(("admin_token" = [])),
)]
pub(crate) async fn list_operator(
    State(state): State<Arc<AppState>>,
    _: Admin,
) -> Result<Json<EventTypeList>, ApiError> {
    let data = state.store.event_types(Some(&CatalogOwner::Operator)).await?.into_iter().map(view).collect();
    Ok(Json(EventTypeList { data }))
}

#[utoipa::path(
    get, path = "/v1/event-types/{name}", tag = "event-types", operation_id = "get_operator_event_type",
    params(OperatorTypePath),
    responses(
        (status = 200, description = "The operator's type", body = EventTypeOut),
        (status = 404, description = "`not_found`: the operator's catalog has no type of this name", body = super::doc::ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn get_operator(
    State(state): State<Arc<AppState>>,
    _: Admin,
    Path(OperatorTypePath { name }): Path<OperatorTypePath>,
) -> Result<Json<EventTypeOut>, ApiError> {
    let t = state.store.event_type(&CatalogOwner::Operator, &name).await?;
    Ok(Json(view(t.ok_or_else(|| ApiError::not_found("event type"))?)))
}

#[utoipa::path(
    patch, path = "/v1/event-types/{name}", tag = "event-types", operation_id = "patch_operator_event_type",
    params(OperatorTypePath), request_body = EventTypeIn,
    responses(
        (status = 404, description = "`not_found`: the operator's catalog has no type of this name", body = super::doc::ErrorBody),
        (status = 200, description = "Changed; a new schema is stored as the next version", body = EventTypeOut),
        (status = 409, description = "`conflict`: another write changed its schema meanwhile", body = super::doc::ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn patch_operator(
    State(state): State<Arc<AppState>>,
    _: Admin,
    Path(OperatorTypePath { name }): Path<OperatorTypePath>,
    JsonBody(input): JsonBody<EventTypeIn>,
) -> Result<Json<EventTypeOut>, ApiError> {
    Ok(Json(view(update(&state, CatalogOwner::Operator, &name, input).await?)))
}

#[utoipa::path(
    delete, path = "/v1/event-types/{name}", tag = "event-types", operation_id = "delete_operator_event_type",
    params(OperatorTypePath),
    responses(
        (status = 204, description = "Deleted with every version of its schema"),
        (status = 404, description = "`not_found`: the operator's catalog has no type of this name", body = super::doc::ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn delete_operator(
    State(state): State<Arc<AppState>>,
    _: Admin,
    Path(OperatorTypePath { name }): Path<OperatorTypePath>,
) -> Result<StatusCode, ApiError> {
    remove(&state, CatalogOwner::Operator, &name).await
}

#[utoipa::path(
    get, path = "/v1/event-types/{name}/versions", tag = "event-types", operation_id = "list_operator_event_type_versions",
    params(OperatorTypePath),
    responses(
        (status = 200, description = "Every version of the type's schema, oldest first", body = SchemaVersionList),
        (status = 404, description = "`not_found`: the operator's catalog has no type of this name", body = super::doc::ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn versions_operator(
    State(state): State<Arc<AppState>>,
    _: Admin,
    Path(OperatorTypePath { name }): Path<OperatorTypePath>,
) -> Result<Json<SchemaVersionList>, ApiError> {
    versions_of(&state, &CatalogOwner::Operator, &name).await
}

// ---- shared ----

/// The types a tenant sees: its own, and the operator's it does not override, by name.
pub(crate) async fn tenant_types(state: &AppState, tenant: &TenantId) -> Result<Vec<EventType>, ApiError> {
    let mut types = state.store.event_types(Some(&CatalogOwner::Tenant(tenant.clone()))).await?;
    let operator = state.store.event_types(Some(&CatalogOwner::Operator)).await?;
    let inherited: Vec<EventType> = operator.into_iter().filter(|o| !types.iter().any(|t| t.name == o.name)).collect();
    types.extend(inherited);
    types.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(types)
}

/// The type of this name a tenant sees: its own, else the operator's.
pub(crate) async fn seen_by(state: &AppState, tenant: &TenantId, name: &str) -> Result<EventType, ApiError> {
    if let Some(t) = state.store.event_type(&CatalogOwner::Tenant(tenant.clone()), name).await? {
        return Ok(t);
    }
    let t = state.store.event_type(&CatalogOwner::Operator, name).await?;
    t.ok_or_else(|| ApiError::not_found("event type"))
}

async fn insert(state: &AppState, owner: CatalogOwner, input: EventTypeIn) -> Result<EventType, ApiError> {
    let name = input.name.ok_or_else(|| ApiError::unprocessable("name: required"))?;
    validate_event_type(&name).map_err(|e| ApiError::unprocessable(format!("name: {e}")))?;
    if name == EXPORT {
        return Err(ApiError::unprocessable(format!("name: {EXPORT:?} is reserved (the catalog's export)")));
    }
    let description = input.description.unwrap_or_default();
    check_text("description", &description, MAX_DESCRIPTION)?;
    let validator = input.schema.as_ref().map(checked_schema).transpose()?;
    let examples = input.examples.unwrap_or_default();
    check_examples(state, &examples, validator.as_ref(), "examples")?;
    let now = state.clock.now();
    let t = EventType {
        owner,
        name,
        description,
        deprecated: input.deprecated.unwrap_or(false),
        examples,
        version: i64::from(input.schema.is_some()),
        schema: input.schema,
        adapters: vec![],
        created_at: now,
        updated_at: now,
    };
    let t = EventType { adapters: checked_adapters(state, &t, input.adapters.unwrap_or_default())?, ..t };
    crate::store::audit::note_resource(&t.name);
    state.store.insert_event_type(&t).await?;
    state.catalog.refresh(&state.store).await?;
    Ok(t)
}

async fn update(state: &AppState, owner: CatalogOwner, name: &str, input: EventTypeIn) -> Result<EventType, ApiError> {
    if input.name.as_deref().is_some_and(|n| n != name) {
        return Err(ApiError::unprocessable("name: a type is not renamed; create one of the new name"));
    }
    let prior = state.store.event_type(&owner, name).await?.ok_or_else(|| ApiError::not_found("event type"))?;
    let mut t = prior.clone();
    if let Some(d) = input.description {
        check_text("description", &d, MAX_DESCRIPTION)?;
        t.description = d;
    }
    if let Some(d) = input.deprecated {
        t.deprecated = d;
    }
    let new_schema = input.schema.filter(|s| Some(s) != prior.schema.as_ref());
    let validator = match &new_schema {
        Some(s) => Some(checked_schema(s)?),
        None => prior.schema.as_ref().map(|s| catalog::compile(s).map_err(ApiError::unprocessable)).transpose()?,
    };
    // A new schema must fit the examples kept (or the ones given with it).
    let (examples, field) = match input.examples {
        Some(e) => (e, "examples"),
        None => (prior.examples.clone(), "examples (kept)"),
    };
    check_examples(state, &examples, validator.as_ref(), field)?;
    t.examples = examples;
    if let Some(s) = new_schema {
        t.schema = Some(s);
        t.version = prior.version + 1;
    }
    let new_adapters = input.adapters.is_some();
    if let Some(adapters) = input.adapters {
        t.adapters = checked_adapters(state, &t, adapters)?;
    }
    t.updated_at = state.clock.now();
    if !state.store.update_event_type(&t, prior.version).await? {
        return Err(ApiError::from(crate::store::StoreError::Conflict(
            "schema: the type changed meanwhile (or was deleted); read it and try again".into(),
        )));
    }
    state.catalog.refresh(&state.store).await?;
    if new_adapters {
        resume_held(state, &t).await?;
    }
    Ok(t)
}

async fn remove(state: &AppState, owner: CatalogOwner, name: &str) -> Result<StatusCode, ApiError> {
    if !state.store.delete_event_type(&owner, name).await? {
        return Err(ApiError::not_found("event type"));
    }
    state.catalog.refresh(&state.store).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn versions_of(state: &AppState, owner: &CatalogOwner, name: &str) -> Result<Json<SchemaVersionList>, ApiError> {
    if state.store.event_type(owner, name).await?.is_none() {
        return Err(ApiError::not_found("event type"));
    }
    let data = state
        .store
        .schema_versions(owner, name)
        .await?
        .into_iter()
        .map(|v| SchemaVersionOut { version: v.version, schema: v.schema, created_at: rfc3339(v.created_at) })
        .collect();
    Ok(Json(SchemaVersionList { data }))
}

/// The most adapters a type keeps.
const MAX_ADAPTERS: usize = 50;

/// Each adapter steps down between versions of `t` that exist (`from` 2 to the latest,
/// `to` 1 to `from` - 1), once per pair, through a plugin of the type's owner that serves a
/// `transform` hook. Errors name the field (`adapters[i].from`).
fn checked_adapters(state: &AppState, t: &EventType, adapters: Vec<Adapter>) -> Result<Vec<Adapter>, ApiError> {
    if adapters.len() > MAX_ADAPTERS {
        return Err(ApiError::unprocessable(format!("adapters: at most {MAX_ADAPTERS}")));
    }
    let owner = match &t.owner {
        CatalogOwner::Operator => OPS_TENANT,
        CatalogOwner::Tenant(tenant) => tenant.as_str(),
    };
    for (i, a) in adapters.iter().enumerate() {
        let bad = |field: &str, why: String| ApiError::unprocessable(format!("adapters[{i}].{field}: {why}"));
        if !(2..=t.version).contains(&a.from) {
            let versions = if t.version < 2 { "none yet".to_string() } else { format!("2 to {}", t.version) };
            return Err(bad("from", format!("version {} cannot be converted from ({versions})", a.from)));
        }
        if !(1..a.from).contains(&a.to) {
            return Err(bad("to", format!("must be an older version: 1 to {}", a.from - 1)));
        }
        if adapters[..i].iter().any(|b| (b.from, b.to) == (a.from, a.to)) {
            return Err(bad("to", format!("a second adapter from v{} to v{}", a.from, a.to)));
        }
        match state.plugins.get(owner, &a.plugin) {
            None => return Err(bad("plugin", format!("no plugin {:?} of {owner} is serving", a.plugin))),
            Some(hooks) if !hooks.contains(crate::plugin::Hook::Transform) => {
                return Err(bad("plugin", format!("{:?} has no transform hook", a.plugin)));
            }
            Some(_) => {}
        }
    }
    Ok(adapters)
}

/// Resumes the endpoints held for a missing adapter of `t` (their reason names the
/// type), now that its adapters changed: each claims again, and holds again if the chain
/// it needs is still missing. An operator type's are every tenant's.
async fn resume_held(state: &AppState, t: &EventType) -> Result<(), ApiError> {
    let prefix = format!("{} {} v", catalog::ADAPTER_MISSING, t.name);
    let tenants = match &t.owner {
        CatalogOwner::Tenant(tenant) => vec![tenant.clone()],
        CatalogOwner::Operator => state.store.list_tenants().await?.into_iter().map(|t| t.id).collect(),
    };
    for tenant in tenants {
        let held = state.store.list_endpoints(&tenant).await?.into_iter().filter(|e| {
            e.state == EndpointState::Paused && e.state_reason.as_deref().is_some_and(|r| r.starts_with(&prefix))
        });
        for e in held {
            state.committer.change_endpoint(EndpointChange::reactivate(e.id.clone(), state.clock.now())).await?;
            tracing::info!(tenant = %tenant, endpoint_id = %e.id, event_type = %t.name,
                "endpoint state change: resumed, its event type's adapters changed");
            state.engine.changed(std::slice::from_ref(&e.id));
            state.engine.poke(std::slice::from_ref(&e.id));
        }
    }
    Ok(())
}

/// Compiles a schema as given, or says why it is not a draft 2020-12 schema.
fn checked_schema(schema: &serde_json::Value) -> Result<catalog::Validator, ApiError> {
    let size = serde_json::to_string(schema).map_or(0, |s| s.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(ApiError::unprocessable(format!("schema: {size} bytes, over the limit of {MAX_SCHEMA_BYTES}")));
    }
    catalog::compile(schema).map_err(|e| ApiError::unprocessable(format!("schema: {e}")))
}

/// Each example is a payload intake would take: within the size limit and valid against
/// the schema.
fn check_examples(
    state: &AppState,
    examples: &[serde_json::Value],
    validator: Option<&catalog::Validator>,
    field: &str,
) -> Result<(), ApiError> {
    if examples.len() > MAX_EXAMPLES {
        return Err(ApiError::unprocessable(format!("{field}: at most {MAX_EXAMPLES}")));
    }
    for (i, example) in examples.iter().enumerate() {
        let size = serde_json::to_string(example).map_or(0, |s| s.len());
        if size > state.config.max_payload_bytes {
            return Err(ApiError::unprocessable(format!(
                "{field}[{i}]: {size} bytes, over the payload limit of {}",
                state.config.max_payload_bytes
            )));
        }
        if let Some(reason) = validator.and_then(|v| catalog::first_failure(v, example)) {
            return Err(ApiError::unprocessable(format!("{field}[{i}]: fails the schema: {reason}")));
        }
    }
    Ok(())
}
