package main

// How pod status reaches the API server. virtual-kubelet writes it with UpdateStatus of the
// whole pod as the provider last reported it, with the resource version of its own cache; the
// pods/status endpoint takes labels, annotations and finalizers from that object too. A label
// set on a running pod (the operator labels pods by role after they start) would then be
// written back to its old value whenever a status update raced the label change, or whenever
// virtual-kubelet re-sends an unchanged status after seeing the pod's metadata change. Like the
// kubelet, which patches only the status, this node writes only the status: onto the pod as
// the API server has it now, and only onto the pod of the same UID.

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

type statusOnlyPods struct{ corev1client.PodsGetter }

func (s statusOnlyPods) Pods(namespace string) corev1client.PodInterface {
	return statusOnlyPodClient{s.PodsGetter.Pods(namespace)}
}

type statusOnlyPodClient struct{ corev1client.PodInterface }

// UpdateStatus writes pod's status, and nothing else of it, onto the current pod of that name
// and UID; a pod of that name with another UID counts as not found (which virtual-kubelet
// ignores).
func (c statusOnlyPodClient) UpdateStatus(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error) {
	var updated *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := c.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.UID != "" && current.UID != pod.UID {
			return apierrors.NewNotFound(corev1.Resource("pods"), pod.Name)
		}
		current.Status = *pod.Status.DeepCopy()
		updated, err = c.PodInterface.UpdateStatus(ctx, current, opts)
		return err
	})
	return updated, err
}
