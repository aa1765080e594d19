//! The console's pages, one module per page or action, and the routes that reach them.

use actix_web::web;

pub mod audit;
pub mod charts;
pub mod events;
pub mod filter;
pub mod layout;
pub mod login;
pub mod overview;
pub mod refusals;
pub mod repair;
pub mod routes;

/// Registers every page and action.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(overview::page))
        .route("/console.css", web::get().to(layout::stylesheet))
        .route("/login", web::get().to(login::form))
        .route("/login", web::post().to(login::submit))
        .route("/logout", web::post().to(login::logout))
        .route("/events", web::get().to(events::list))
        .route("/events/{id}", web::get().to(events::detail))
        .route("/events/{id}/replay", web::post().to(repair::replay_one))
        .route("/replay", web::get().to(repair::estimate))
        .route("/replay", web::post().to(repair::start))
        .route("/jobs/{id}", web::get().to(repair::progress))
        .route("/jobs/{id}/abort", web::post().to(repair::abort))
        .route("/routes", web::get().to(routes::page))
        .route("/routes/pause", web::post().to(routes::pause))
        .route("/routes/resume", web::post().to(routes::resume))
        .route("/keys/skip", web::post().to(routes::skip))
        .route("/refusals", web::get().to(refusals::page))
        .route("/replays/release", web::post().to(refusals::release))
        .route("/audit", web::get().to(audit::page));
}
