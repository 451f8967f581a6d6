// Package deploy holds what installs tether: the container image build (the
// Dockerfile at the repository root, staged by `make image`) and the Helm
// charts under helm/. It has no Go API; its tests render the charts with
// helm, decode every manifest into the Kubernetes API types, and check the
// result against the flags and endpoints of the tether binary.
package deploy
