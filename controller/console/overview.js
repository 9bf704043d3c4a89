// The overview (/): one row per backend, with its Scale and Delete buttons.

import { getJSON, pages, paths } from "./api.js";
import * as actions from "./actions.js";
import { badge, dash, el, link, loadText, range, syncRows, table, versionText } from "./dom.js";
import { live } from "./live.js";
import { disableActions, setLeadership } from "./ui.js";

export function overviewPage(main, signal) {
  document.title = "Backends - trio-replica-controller";
  const { table: backends, tbody } = table("backends", [
    "Name", "State", "Ready", "Version", "Load", "Autoscaling", "Route", "Message", "",
  ]);
  backends.hidden = true;
  const empty = el("p", { className: "empty", hidden: true },
    "No backends. Apply some with ", el("code", {}, "controller apply -f FILE"), ".");
  // The runtime's nodes, with their state, ingress and replicas (hidden without nodes).
  const { table: nodes, tbody: nodeRows } = table("nodes", [
    "Node", "State", "Address", "Ingress", "Replicas",
  ]);
  const nodesHeading = el("h2", { hidden: true }, "Nodes");
  nodes.hidden = true;
  // Applications: backends applied as one (hidden without any).
  const { table: apps, tbody: appRows } = table("applications", [
    "Application", "State", "Revision", "Members",
  ]);
  const appsHeading = el("h2", { hidden: true }, "Applications");
  apps.hidden = true;
  main.replaceChildren(
    el("h1", {}, "Backends"), backends, empty, appsHeading, apps, nodesHeading, nodes,
  );

  // The latest status of each backend: a button acts on what the page shows now.
  let latest = new Map();

  function row(status) {
    const name = status.name;
    return el("tr", { dataset: { backend: name } },
      el("td", { className: "name" }, link(pages.backend(name), name)),
      el("td", {}, badge(status.state)),
      el("td", { className: "ready" }, `${status.ready}/${status.desired}`),
      el("td", {}, versionText(status)),
      el("td", { className: "load" }, loadText(status.load)),
      el("td", {}, range(status.config?.autoscaling)),
      el("td", {}, dash(status.config?.route_prefix)),
      el("td", { className: "message" }, dash(status.message)),
      el("td", { className: "actions" },
        el("button", {
          type: "button",
          dataset: { action: "scale" },
          onclick: () => actions.scale(latest.get(name) ?? status),
        }, "Scale"),
        el("button", {
          type: "button",
          className: "danger",
          dataset: { action: "delete" },
          onclick: () => actions.remove(name),
        }, "Delete"),
      ),
    );
  }

  async function refresh() {
    const data = await getJSON(paths.backends(), signal);
    setLeadership(data.leadership);
    const list = data.backends ?? [];
    latest = new Map(list.map((s) => [s.name, s]));
    syncRows(tbody, list, {
      key: (s) => s.name,
      sig: (s) => JSON.stringify([
        s.state, s.ready, s.desired, versionText(s), loadText(s.load),
        range(s.config?.autoscaling), s.config?.route_prefix, s.message,
      ]),
      render: row,
    });
    backends.hidden = list.length === 0;
    empty.hidden = list.length !== 0;
    disableActions(main);
    await refreshApplications();
    await refreshNodes();
  }

  function appRow(app) {
    // Each member links to its backend's page; the entry first, marked.
    const members = app.members.flatMap((m, i) => [
      i ? ", " : "",
      link(pages.backend(m.name), m.name),
      m.entry ? " (entry)" : "",
      m.state === "HEALTHY" ? "" : ` ${m.state}`,
    ]);
    return el("tr", { dataset: { application: app.name } },
      el("td", { className: "name" }, app.name),
      el("td", {}, badge(app.state)),
      el("td", {}, dash(app.revision)),
      el("td", { className: "members" }, ...members),
    );
  }

  async function refreshApplications() {
    let list = [];
    try {
      list = (await getJSON(paths.applications(), signal)).applications ?? [];
    } catch (error) {
      if (error?.name === "AbortError" || error?.status === 0) throw error;
      // An older daemon without applications: no table.
    }
    syncRows(appRows, list, {
      key: (a) => a.name,
      sig: (a) => JSON.stringify(a),
      render: appRow,
    });
    apps.hidden = appsHeading.hidden = list.length === 0;
  }

  function nodeRow(node) {
    const replicas = Object.entries(node.replicas).map(([b, n]) => `${b}=${n}`).join(", ");
    const state = node.notice ? `${node.state} (cluster's notice)` : node.state;
    return el("tr", { dataset: { node: node.id } },
      el("td", { className: "name" }, node.id),
      el("td", {}, state),
      el("td", {}, dash(node.address)),
      el("td", {}, dash((node.ingresses ?? []).filter((a) => a).join(", "))),
      el("td", {}, dash(replicas)),
    );
  }

  async function refreshNodes() {
    let list = [];
    try {
      list = (await getJSON(paths.nodes(), signal)).nodes ?? [];
    } catch (error) {
      if (error?.name === "AbortError" || error?.status === 0) throw error;
      // A runtime without nodes (501), or a standby that has none to show: no table.
    }
    syncRows(nodeRows, list, {
      key: (n) => n.id,
      sig: (n) => JSON.stringify(n),
      render: nodeRow,
    });
    nodes.hidden = nodesHeading.hidden = list.length === 0;
  }

  live(signal, refresh);
}
