// Package deploy holds metergate's deployment assets (Dockerfile, Kubernetes manifests,
// the local stack scripts); its tests keep them in step with the binaries' configuration.
package deploy
