package main

// A container's environment, resolved as the kubelet does: the image's variables, then
// envFrom, then env (value with $(VAR) expansion, secretKeyRef, configMapKeyRef, fieldRef,
// resourceFieldRef), plus the in-cluster API server address and the pod's address for the
// bind shim.

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
)

func everything() labels.Selector { return labels.Everything() }

// resolveEnv returns KEY=value lines; an error is a CreateContainerConfigError.
func resolveEnv(ctx context.Context, p *provider, pod *corev1.Pod, spec corev1.Container, imageEnv []string, podIP string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	env := newOrderedEnv(imageEnv)
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	env.set("HOSTNAME", hostname)
	env.set("KUBERNETES_SERVICE_HOST", p.cfg.apiHost)
	env.set("KUBERNETES_SERVICE_PORT", p.cfg.apiPort)
	env.set("KUBERNETES_SERVICE_PORT_HTTPS", p.cfg.apiPort)
	env.set("KUBERNETES_PORT", fmt.Sprintf("tcp://%s:%s", p.cfg.apiHost, p.cfg.apiPort))

	for _, from := range spec.EnvFrom {
		values, err := envFromSource(ctx, p, pod.Namespace, from)
		if err != nil {
			return nil, err
		}
		for _, kv := range values {
			env.set(from.Prefix+kv[0], kv[1])
		}
	}
	// $(VAR) references see the variables defined before them in the container's env.
	defined := map[string]string{}
	for _, e := range spec.Env {
		if e.ValueFrom == nil {
			value := expand(e.Value, defined)
			env.set(e.Name, value)
			defined[e.Name] = value
			continue
		}
		value, found, err := envValueFrom(ctx, p, pod, spec, e.ValueFrom, podIP)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if found {
			env.set(e.Name, value)
			defined[e.Name] = value
		}
	}
	env.set("PGKUBE_TESTBED_POD_IP", podIP)
	env.set("LD_PRELOAD", p.shimPath)
	return env.lines(), nil
}

func envFromSource(ctx context.Context, p *provider, namespace string, from corev1.EnvFromSource) ([][2]string, error) {
	var data map[string][]byte
	var err error
	switch {
	case from.ConfigMapRef != nil:
		ref := from.ConfigMapRef
		data, err = p.objectData(ctx, configMapKind, namespace, ref.Name, ref.Optional != nil && *ref.Optional)
	case from.SecretRef != nil:
		ref := from.SecretRef
		data, err = p.objectData(ctx, secretKind, namespace, ref.Name, ref.Optional != nil && *ref.Optional)
	}
	if err != nil {
		return nil, err
	}
	var values [][2]string
	for key, value := range data {
		values = append(values, [2]string{key, string(value)})
	}
	return values, nil
}

// envValueFrom resolves one valueFrom; found is false for an optional reference that is missing.
func envValueFrom(ctx context.Context, p *provider, pod *corev1.Pod, spec corev1.Container, from *corev1.EnvVarSource, podIP string) (string, bool, error) {
	switch {
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		return p.keyValue(ctx, secretKind, pod.Namespace, ref.Name, ref.Key, ref.Optional != nil && *ref.Optional)
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		return p.keyValue(ctx, configMapKind, pod.Namespace, ref.Name, ref.Key, ref.Optional != nil && *ref.Optional)
	case from.FieldRef != nil:
		withIP := pod.DeepCopy()
		withIP.Status.PodIP, withIP.Status.PodIPs = podIP, []corev1.PodIP{{IP: podIP}}
		value, err := fieldValue(withIP, from.FieldRef.FieldPath)
		return value, err == nil, err
	case from.ResourceFieldRef != nil:
		value, err := resourceValue(p, spec, from.ResourceFieldRef)
		return value, err == nil, err
	}
	return "", false, fmt.Errorf("unsupported valueFrom")
}

// fieldValue is the downward API's view of a pod field.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	if key, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(key, "']")], nil
	}
	if key, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(key, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return "127.0.0.1", nil
	case "status.podIP", "status.podIPs":
		return pod.Status.PodIP, nil
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

// formatMap is key="value" lines sorted by key, as the kubelet writes them (a stable order, so
// that a downward API volume is rewritten only when a value changes).
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	lines := make([]string, 0, len(m))
	for _, key := range keys {
		lines = append(lines, fmt.Sprintf("%s=%q", key, m[key]))
	}
	return strings.Join(lines, "\n")
}

// resourceValue gives a container's request or limit in units of the divisor, rounded up as
// the kubelet does; a missing limit is the node's capacity.
func resourceValue(p *provider, spec corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	var quantity resource.Quantity
	var ok bool
	switch ref.Resource {
	case "limits.cpu", "limits.memory", "limits.ephemeral-storage":
		quantity, ok = spec.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(ref.Resource, "limits."))]
	case "requests.cpu", "requests.memory", "requests.ephemeral-storage":
		quantity, ok = spec.Resources.Requests[corev1.ResourceName(strings.TrimPrefix(ref.Resource, "requests."))]
	default:
		return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	if !ok {
		switch {
		case strings.HasSuffix(ref.Resource, "cpu"):
			quantity = *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)
		case strings.HasSuffix(ref.Resource, "memory"):
			quantity = *resource.NewQuantity(totalMemoryBytes(), resource.BinarySI)
		default:
			quantity = resource.MustParse("0")
		}
	}
	value := math.Ceil(float64(quantity.MilliValue()) / float64(divisor.MilliValue()))
	return fmt.Sprintf("%d", int64(value)), nil
}

// orderedEnv keeps variables in first-definition order, later values winning.
type orderedEnv struct {
	names  []string
	values map[string]string
}

func newOrderedEnv(lines []string) *orderedEnv {
	env := &orderedEnv{values: map[string]string{}}
	for _, line := range lines {
		if name, value, ok := strings.Cut(line, "="); ok {
			env.set(name, value)
		}
	}
	return env
}

func (e *orderedEnv) set(name, value string) {
	if _, ok := e.values[name]; !ok {
		e.names = append(e.names, name)
	}
	e.values[name] = value
}

func (e *orderedEnv) lines() []string {
	lines := make([]string, 0, len(e.names))
	for _, name := range e.names {
		lines = append(lines, name+"="+e.values[name])
	}
	return lines
}

func envMap(lines []string) map[string]string {
	m := map[string]string{}
	for _, line := range lines {
		if name, value, ok := strings.Cut(line, "="); ok {
			m[name] = value
		}
	}
	return m
}

// expand replaces $(VAR) with its value when VAR is defined, turns $$ into $, and leaves
// anything else as written, as Kubernetes does in command, args and env values.
func expand(text string, vars map[string]string) string {
	var out strings.Builder
	for i := 0; i < len(text); i++ {
		if text[i] != '$' || i+1 >= len(text) {
			out.WriteByte(text[i])
			continue
		}
		switch next := text[i+1]; {
		case next == '$':
			out.WriteByte('$')
			i++
		case next == '(':
			end := strings.IndexByte(text[i+2:], ')')
			if end < 0 {
				out.WriteString(text[i:])
				return out.String()
			}
			name := text[i+2 : i+2+end]
			if value, ok := vars[name]; ok {
				out.WriteString(value)
			} else {
				out.WriteString(text[i : i+3+end])
			}
			i += 2 + end
		default:
			out.WriteByte('$')
		}
	}
	return out.String()
}
