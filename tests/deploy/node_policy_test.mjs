// deploy/node-policy.yaml's ValidatingAdmissionPolicy, evaluated as the kube-apiserver does on
// allowed and refused requests, with a real CEL evaluator (Buf's @bufbuild/cel, conformance-
// tested against the CEL spec): the policy's own resourceRules decide whether a request is
// matched, then its matchConditions, its variables in order, and every validation; an
// expression that errors refuses the request (failurePolicy: Fail). Run by ctest
// (deploy_node_policy_cel) with node; the packages come from tools/install-npm-deps.sh.
import { createRequire } from "node:module";
import { readFileSync, existsSync } from "node:fs";
import path from "node:path";
import os from "node:os";

const source = process.env.GNS_SOURCE_DIR ?? path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const prefix = process.env.GNS_NPM_PREFIX ??
  path.join(process.env.XDG_CACHE_HOME ?? path.join(os.homedir(), ".cache"), "gpu-node-supervisor", "npm");
if (!existsSync(path.join(prefix, "node_modules", "@bufbuild", "cel"))) {
  console.error(`no @bufbuild/cel under ${prefix}: run tools/install-deps.sh (or tools/install-npm-deps.sh)`);
  process.exit(1);
}
const require = createRequire(path.join(prefix, "package.json"));
const { run } = require("@bufbuild/cel");
const YAML = require("yaml");

const docs = YAML.parseAllDocuments(readFileSync(path.join(source, "deploy/node-policy.yaml"), "utf8")).map((d) => d.toJS());
const policy = docs.find((d) => d.kind === "ValidatingAdmissionPolicy");
const binding = docs.find((d) => d.kind === "ValidatingAdmissionPolicyBinding");

// JSON as CEL sees Kubernetes objects: maps, lists, int (bigint), string, bool, null.
function toCel(v) {
  if (Array.isArray(v)) return v.map(toCel);
  if (v !== null && typeof v === "object") return new Map(Object.entries(v).map(([k, x]) => [k, toCel(x)]));
  if (typeof v === "number" && Number.isInteger(v)) return BigInt(v);
  return v;
}

function ruleMatches(rule, req) {
  const [group, version, resource] = [req.resource.group, req.resource.version, req.resource.resource];
  const full = req.subResource ? `${resource}/${req.subResource}` : resource;
  const any = (list, x) => list.includes("*") || list.includes(x);
  return any(rule.apiGroups, group) && any(rule.apiVersions, version) && any(rule.operations, req.operation) &&
    rule.resources.includes(full);
}

// "allowed" | "refused: <message>" | "not matched".
function admit(req, object, oldObject) {
  if (!policy.spec.matchConstraints.resourceRules.some((r) => ruleMatches(r, req))) return "not matched";
  const vars = { request: toCel(req), object: toCel(object), oldObject: toCel(oldObject) };
  for (const c of policy.spec.matchConditions ?? []) {
    if (run(c.expression, vars) !== true) return "not matched";
  }
  const variables = new Map();
  for (const v of policy.spec.variables ?? []) {
    try {
      variables.set(v.name, run(v.expression, { ...vars, variables }));
    } catch (e) {
      return `refused: variable ${v.name}: ${e.message}`;
    }
  }
  for (const v of policy.spec.validations) {
    let ok;
    try {
      ok = run(v.expression, { ...vars, variables });
    } catch (e) {
      return `refused: error: ${e.message}`;
    }
    if (ok !== true) return `refused: ${v.message.trim()}`;
  }
  return "allowed";
}

const SA = "system:serviceaccount:gpu-node-supervisor:gpu-node-supervisor";
const onNode = (node) => ({
  username: SA, uid: "u-1", groups: ["system:serviceaccounts", "system:authenticated"],
  extra: node === null ? {} : { "authentication.kubernetes.io/node-name": [node],
                                "authentication.kubernetes.io/pod-name": ["gpu-node-supervisor-x"] },
});
function request(user, operation, group, version, resource, name, { sub = "", ns = "" } = {}) {
  return { uid: "r-1", operation, name, namespace: ns, subResource: sub, userInfo: user,
           resource: { group, version, resource }, kind: { group, version, kind: "X" } };
}
const node = (name, labels = {}) => ({ apiVersion: "v1", kind: "Node", metadata: { name, labels } });
const pod = (name, nodeName) => ({ apiVersion: "v1", kind: "Pod", metadata: { name, namespace: "ml" },
                                   spec: nodeName === undefined ? { containers: [] } : { nodeName, containers: [] } });
const slice = (nodeName) => ({ apiVersion: "resource.k8s.io/v1", kind: "ResourceSlice",
                               metadata: { name: `${nodeName}-compute-domain.nvidia.com-x` },
                               spec: { driver: "compute-domain.nvidia.com", nodeName, pool: { name: nodeName, generation: 1, resourceSliceCount: 1 } } });
const cacheNode = (specNode, labelNode = specNode) => ({ apiVersion: "gkm.io/v1alpha1", kind: "GKMCacheNode",
  metadata: { name: `c-${specNode}`, namespace: "ml", labels: { "gkm.node": labelNode, "gkm.io/cache": "c" } },
  spec: { nodeName: specNode, cacheName: "c" } });
const entry = (nodeName, status = "Ready", index = 0) => ({ nodeName, ipAddress: `10.0.0.${index + 1}`, cliqueID: "cl.1", index, status });
const clique = (...daemons) => ({ apiVersion: "resource.nvidia.com/v1beta1", kind: "ComputeDomainClique",
  metadata: { name: "uid.cl.1", namespace: "ml" }, daemons });

const n1 = onNode("node-1");
const cases = [
  // [what, expected, request, object, oldObject]
  ["its own Node (labels)", "allowed", request(n1, "UPDATE", "", "v1", "nodes", "node-1"), node("node-1"), node("node-1")],
  ["another Node", "refused", request(n1, "UPDATE", "", "v1", "nodes", "node-2"), node("node-2"), node("node-2")],
  ["its own Node's status", "allowed", request(n1, "UPDATE", "", "v1", "nodes", "node-1", { sub: "status" }), node("node-1"), node("node-1")],
  ["another Node's status", "refused", request(n1, "UPDATE", "", "v1", "nodes", "node-2", { sub: "status" }), node("node-2"), node("node-2")],
  ["a token bound to no node", "refused", request(onNode(null), "UPDATE", "", "v1", "nodes", "node-1"), node("node-1"), node("node-1")],
  ["a token with no extra at all", "refused",
   request({ username: SA, groups: [] }, "UPDATE", "", "v1", "nodes", "node-1"), node("node-1"), node("node-1")],
  ["a pod bound to its node", "allowed", request(n1, "UPDATE", "", "v1", "pods", "p", { ns: "ml" }), pod("p", "node-1"), pod("p", "node-1")],
  ["a pod bound to another node", "refused", request(n1, "UPDATE", "", "v1", "pods", "p", { ns: "ml" }), pod("p", "node-2"), pod("p", "node-2")],
  ["a pod the patch would move here", "refused", request(n1, "UPDATE", "", "v1", "pods", "p", { ns: "ml" }), pod("p", "node-1"), pod("p", "node-2")],
  ["an unscheduled pod", "refused", request(n1, "UPDATE", "", "v1", "pods", "p", { ns: "ml" }), pod("p"), pod("p")],
  ["its ResourceSlice created", "allowed", request(n1, "CREATE", "resource.k8s.io", "v1", "resourceslices", ""), slice("node-1"), null],
  ["its ResourceSlice (v1beta1)", "allowed", request(n1, "UPDATE", "resource.k8s.io", "v1beta1", "resourceslices", "s"), slice("node-1"), slice("node-1")],
  ["another node's ResourceSlice created", "refused", request(n1, "CREATE", "resource.k8s.io", "v1", "resourceslices", ""), slice("node-2"), null],
  ["another node's ResourceSlice taken over", "refused", request(n1, "UPDATE", "resource.k8s.io", "v1", "resourceslices", "s"), slice("node-1"), slice("node-2")],
  ["its ResourceSlice deleted", "allowed", request(n1, "DELETE", "resource.k8s.io", "v1", "resourceslices", "s"), null, slice("node-1")],
  ["another node's ResourceSlice deleted", "refused", request(n1, "DELETE", "resource.k8s.io", "v1", "resourceslices", "s"), null, slice("node-2")],
  ["a ResourceSlice of no node", "refused", request(n1, "CREATE", "resource.k8s.io", "v1", "resourceslices", ""),
   { ...slice("node-1"), spec: { driver: "x", allNodes: true } }, null],
  ["its GKMCacheNode applied", "allowed", request(n1, "CREATE", "gkm.io", "v1alpha1", "gkmcachenodes", "c-node-1", { ns: "ml" }), cacheNode("node-1"), null],
  ["its GKMCacheNode status", "allowed", request(n1, "UPDATE", "gkm.io", "v1alpha1", "gkmcachenodes", "c-node-1", { ns: "ml", sub: "status" }), cacheNode("node-1"), cacheNode("node-1")],
  ["another node's GKMCacheNode", "refused", request(n1, "CREATE", "gkm.io", "v1alpha1", "gkmcachenodes", "c", { ns: "ml" }), cacheNode("node-2"), null],
  ["a GKMCacheNode labelled for another node", "refused", request(n1, "CREATE", "gkm.io", "v1alpha1", "gkmcachenodes", "c", { ns: "ml" }), cacheNode("node-1", "node-2"), null],
  ["another node's ClusterGKMCacheNode deleted", "refused", request(n1, "DELETE", "gkm.io", "v1alpha1", "clustergkmcachenodes", "c"), null, cacheNode("node-2")],
  ["its ClusterGKMCacheNode deleted", "allowed", request(n1, "DELETE", "gkm.io", "v1alpha1", "clustergkmcachenodes", "c"), null, cacheNode("node-1")],
  ["a clique created with its entry", "allowed", request(n1, "CREATE", "resource.nvidia.com", "v1beta1", "computedomaincliques", "", { ns: "ml" }), clique(entry("node-1")), null],
  ["a clique created with another's entry", "refused", request(n1, "CREATE", "resource.nvidia.com", "v1beta1", "computedomaincliques", "", { ns: "ml" }), clique(entry("node-1"), entry("node-2", "Ready", 1)), null],
  ["its entry added beside others", "allowed", request(n1, "UPDATE", "resource.nvidia.com", "v1beta1", "computedomaincliques", "uid.cl.1", { ns: "ml" }),
   clique(entry("node-2", "Ready", 1), entry("node-1")), clique(entry("node-2", "Ready", 1))],
  ["its entry turned NotReady", "allowed", request(n1, "UPDATE", "resource.nvidia.com", "v1beta1", "computedomaincliques", "uid.cl.1", { ns: "ml" }),
   clique(entry("node-1", "NotReady"), entry("node-2", "Ready", 1)), clique(entry("node-1"), entry("node-2", "Ready", 1))],
  ["another's entry turned NotReady", "refused", request(n1, "UPDATE", "resource.nvidia.com", "v1beta1", "computedomaincliques", "uid.cl.1", { ns: "ml" }),
   clique(entry("node-1"), entry("node-2", "NotReady", 1)), clique(entry("node-1"), entry("node-2", "Ready", 1))],
  ["an entry for another node added", "refused", request(n1, "UPDATE", "resource.nvidia.com", "v1beta1", "computedomaincliques", "uid.cl.1", { ns: "ml" }),
   clique(entry("node-1"), entry("node-3", "Ready", 2)), clique(entry("node-1"))],
  // The controller (same ServiceAccount, on the leader's node) removes vanished nodes' entries.
  ["a vanished node's entry removed", "allowed", request(n1, "UPDATE", "resource.nvidia.com", "v1beta1", "computedomaincliques", "uid.cl.1", { ns: "ml" }),
   clique(entry("node-2", "Ready", 1)), clique(entry("node-2", "Ready", 1), entry("node-9", "Ready", 2))],
  // Outside the policy: other users, reads, evictions (documented in node-policy.yaml).
  ["the kubelet of node-2 writing its Node", "not matched",
   request({ username: "system:node:node-2", groups: ["system:nodes"], extra: {} }, "UPDATE", "", "v1", "nodes", "node-2"), node("node-2"), node("node-2")],
  ["an eviction", "not matched", request(n1, "CREATE", "", "v1", "pods", "p", { ns: "ml", sub: "eviction" }),
   { apiVersion: "policy/v1", kind: "Eviction", metadata: { name: "p", namespace: "ml" } }, null],
];

let passed = 0;
let failed = 0;
for (const [what, expected, req, object, oldObject] of cases) {
  const got = admit(req, object, oldObject);
  const kind = got.startsWith("refused") ? "refused" : got;
  if (kind === expected) {
    passed++;
    console.log(`ok   ${what}: ${got}`);
  } else {
    failed++;
    console.log(`FAIL ${what}: expected ${expected}, got ${got}`);
  }
}
// The binding enforces the policy (Deny), and the user the policy confines is the bundle's.
const check = (what, ok) => { if (ok) { passed++; console.log(`ok   ${what}`); } else { failed++; console.log(`FAIL ${what}`); } };
check("the binding names the policy and denies", binding?.spec.policyName === policy.metadata.name &&
      JSON.stringify(binding.spec.validationActions) === JSON.stringify(["Deny"]));
check("failurePolicy is Fail", policy.spec.failurePolicy === "Fail");
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
