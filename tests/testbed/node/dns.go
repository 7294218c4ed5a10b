package main

// Name resolution without a DNS server: every pod's /etc/hosts (a file of its own, bind-mounted
// in its mount namespace) lists
//   - localhost and the pod's own names, at the pod's address;
//   - every Service, as `svc.ns.svc` and `svc.ns.svc.cluster.local` (and `svc`, `svc.ns` in
//     the pod's own namespace), at the addresses of the ready pods on this node and on its
//     peers (--peer-nodes) that its selector matches (not-ready ones too when it publishes
//     them);
//   - pods of a headless Service as `hostname.subdomain.ns.svc[.cluster.local]`.
// Names resolve to pod addresses, not to a ClusterIP: there is no kube-proxy, so a Service
// works when its port equals its target port. The files are rewritten in place (the mount
// follows the inode) whenever pods or Services change, and only when their content does.

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

const clusterDomain = "cluster.local"

func (p *provider) markDNSDirty() {
	select {
	case p.dnsDirty <- struct{}{}:
	default:
	}
}

// dnsLoop rewrites every pod's hosts file after changes, at most every 100 ms.
func (p *provider) dnsLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.dnsDirty:
		}
		time.Sleep(100 * time.Millisecond)
		p.mu.Lock()
		runtimes := make([]*podRuntime, 0, len(p.pods))
		for _, runtime := range p.pods {
			runtimes = append(runtimes, runtime)
		}
		p.mu.Unlock()
		for _, runtime := range runtimes {
			if err := p.writeHosts(runtime); err != nil && !os.IsNotExist(err) {
				log.Printf("pod %s: hosts file: %v", runtime, err)
			}
		}
	}
}

// hostsEntry is one pod's address and readiness as name resolution sees it.
type hostsEntry struct {
	ip        string
	ready     bool
	labels    labels.Set
	namespace string
	hostname  string
	subdomain string
}

func (p *provider) hostsEntries() ([]hostsEntry, []*corev1.Service) {
	p.mu.Lock()
	runtimes := make([]*podRuntime, 0, len(p.pods))
	for _, runtime := range p.pods {
		runtimes = append(runtimes, runtime)
	}
	services := p.services
	var peers []*corev1.Pod
	for _, pods := range p.peerPods {
		peers = append(peers, pods...)
	}
	p.mu.Unlock()
	var entries []hostsEntry
	for _, pod := range peers {
		if pod.Status.PodIP == "" || pod.DeletionTimestamp != nil ||
			pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		hostname := pod.Spec.Hostname
		if hostname == "" {
			hostname = pod.Name
		}
		entries = append(entries, hostsEntry{
			ip: pod.Status.PodIP, ready: podReady(pod), labels: pod.Labels, namespace: pod.Namespace,
			hostname: hostname, subdomain: pod.Spec.Subdomain,
		})
	}
	for _, runtime := range runtimes {
		pod := runtime.snapshot()
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		entries = append(entries, hostsEntry{
			ip: runtime.ip, ready: podReady(pod), labels: pod.Labels, namespace: pod.Namespace,
			hostname: runtime.hostname(), subdomain: pod.Spec.Subdomain,
		})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].ip < entries[j].ip })
	return entries, services
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// writeHosts writes one pod's hosts file.
func (p *provider) writeHosts(runtime *podRuntime) error {
	entries, services := p.hostsEntries()
	pod := runtime.snapshot()
	var b strings.Builder
	b.WriteString("# Written by the test bed node agent for this pod.\n")
	own := []string{"localhost", runtime.hostname()}
	if pod.Spec.Subdomain != "" {
		own = append(own, headlessNames(runtime.hostname(), pod.Spec.Subdomain, pod.Namespace)...)
	}
	fmt.Fprintf(&b, "%s\t%s\n", runtime.ip, strings.Join(own, " "))
	for _, svc := range services {
		if svc.Spec.Selector == nil {
			continue
		}
		selector := labels.SelectorFromSet(svc.Spec.Selector)
		names := []string{
			fmt.Sprintf("%s.%s.svc", svc.Name, svc.Namespace),
			fmt.Sprintf("%s.%s.svc.%s", svc.Name, svc.Namespace, clusterDomain),
		}
		if svc.Namespace == pod.Namespace {
			names = append(names, svc.Name, svc.Name+"."+svc.Namespace)
		}
		for _, entry := range entries {
			if entry.namespace != svc.Namespace || !selector.Matches(entry.labels) {
				continue
			}
			if entry.ready || svc.Spec.PublishNotReadyAddresses {
				fmt.Fprintf(&b, "%s\t%s\n", entry.ip, strings.Join(names, " "))
			}
			if entry.subdomain == svc.Name && entry.ip != runtime.ip {
				fmt.Fprintf(&b, "%s\t%s\n", entry.ip, strings.Join(headlessNames(entry.hostname, svc.Name, svc.Namespace), " "))
			}
		}
	}
	return rewriteInPlace(filepath.Join(runtime.dir, "etc", "hosts"), b.String())
}

// rewriteInPlace makes the file at path hold content, in place, not by rename: the containers'
// bind mounts hold on to this inode. A pod resolves names all the time while files are
// rewritten after every pod change, so the file is left alone when it already holds content,
// and otherwise never truncated before it is written (a reader would find it empty, and a name
// such as a Service's would not resolve): the new content goes over the old one, then the file
// is cut to its length.
func rewriteInPlace(path, content string) error {
	if current, err := os.ReadFile(path); err == nil && string(current) == content {
		return nil
	}
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := file.WriteAt([]byte(content), 0); err != nil {
		file.Close()
		return err
	}
	if err := file.Truncate(int64(len(content))); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}

func headlessNames(hostname, subdomain, namespace string) []string {
	return []string{
		fmt.Sprintf("%s.%s.%s.svc", hostname, subdomain, namespace),
		fmt.Sprintf("%s.%s.%s.svc.%s", hostname, subdomain, namespace, clusterDomain),
	}
}
